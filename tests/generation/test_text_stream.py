"""Incremental detokenisation and stop strings, piece by piece."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from swarm_generation.text_stream import IncrementalDetokenizer, StopStrings


def test_pieces_never_split_a_utf8_character(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tokenizer.encode("Say:", add_special_tokens=False)
    text = " héllo wörld 🙂 ñandú, 東京 done"
    ids = tokenizer.encode(text, add_special_tokens=False)
    # The tiny byte-level BPE splits these characters into several tokens each.
    assert len(ids) > len(text.split())
    stream = IncrementalDetokenizer(tokenizer, prompt)
    pieces = [stream.add(i) for i in ids]
    pieces.append(stream.flush())
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text
    assert "" in pieces  # some tokens were held back until their character was complete


def test_the_tail_that_could_start_a_stop_string_is_held_back() -> None:
    stops = StopStrings(("END", "\n\n"))
    assert stops.feed("abc E") == "abc "
    assert stops.feed("N") == ""  # "EN" could still become "END"
    assert stops.feed("ough") == "ENough"  # it did not
    assert stops.feed("x\n") == "x"
    assert stops.feed("\nmore") == ""
    assert stops.stopped
    assert stops.text == "abc ENoughx"
    assert stops.feed("after") == ""
    assert stops.finish() == ""


def test_a_stop_string_split_over_pieces_is_found() -> None:
    stops = StopStrings(("<|end|>",))
    shown = stops.feed("answer <|") + stops.feed("en") + stops.feed("d|> trailing")
    assert shown == "answer "
    assert stops.stopped


def test_without_stop_strings_nothing_is_held() -> None:
    stops = StopStrings(())
    assert stops.feed("abc") == "abc"
    assert stops.finish() == ""
