"""The one naming rule: names are single tokens, labels are text that is never a path."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from swarm_contracts.names import (
    LABEL_MAX,
    NAME_MAX,
    Label,
    Name,
    check_label,
    check_name,
    label_from_filename,
)

BAD_NAMES = [
    "../../../../tmp/x",
    "a/b",
    "a\\b",
    "..",
    ".hidden",
    "a.b",
    "a\x00b",
    "a\nb",
    "a\x1b[31m",
    "Upper",
    "café",
    "a b",
    "a*",
    "a>",
    "-lead",
    "",
    "x" * (NAME_MAX + 1),
    "bad\udcff",  # a non-UTF-8 byte, as Python decodes one with surrogateescape
]


@pytest.mark.parametrize("value", BAD_NAMES)
def test_bad_names_are_refused(value: str) -> None:
    with pytest.raises(ValueError, match="adapter name"):
        check_name(value, "adapter name")


@pytest.mark.parametrize("value", ["a", "support-bot", "tiny_llama2", "x" * NAME_MAX])
def test_good_names_pass_unchanged(value: str) -> None:
    assert check_name(value) == value


def test_the_message_escapes_control_characters() -> None:
    with pytest.raises(ValueError, match=r"\\x1b") as info:
        check_name("a\x1b[2Jb")
    assert "\x1b" not in str(info.value)
    assert "\\x1b" in str(info.value)


@pytest.mark.parametrize(
    "value",
    [
        "../../../../tmp/x.jsonl",
        "a/b",
        "c:\\temp\\x",
        "..",
        ".",
        "line\nbreak",
        "nul\x00",
        "bell\x07",
        "rtl\u202eoverride",
        "bad\udcff",
        "   ",
        "y" * (LABEL_MAX + 1),
    ],
)
def test_bad_labels_are_refused(value: str) -> None:
    with pytest.raises(ValueError, match="label"):
        check_label(value)


@pytest.mark.parametrize("value", ["support chats (v2).jsonl", "données d'été", "x" * LABEL_MAX])
def test_good_labels_pass_unchanged(value: str) -> None:
    assert check_label(value) == value


@pytest.mark.parametrize(
    ("filename", "label"),
    [
        ("../../../../tmp/x.jsonl", "x.jsonl"),
        ("C:\\Users\\me\\chats.jsonl", "chats.jsonl"),
        ("plain.jsonl", "plain.jsonl"),
    ],
)
def test_a_file_name_becomes_its_base_name(filename: str, label: str) -> None:
    assert label_from_filename(filename) == label


@pytest.mark.parametrize("filename", ["dir/", "../..", "a/\x00.jsonl"])
def test_a_file_name_that_names_no_file_is_refused(filename: str) -> None:
    with pytest.raises(ValueError, match="file name"):
        label_from_filename(filename)


def test_the_field_types_apply_the_same_rules() -> None:
    class Thing(BaseModel):
        name: Name
        label: Label

    assert Thing(name="bot", label="my data").name == "bot"
    for bad in ({"name": "../x", "label": "ok"}, {"name": "ok", "label": "a/../b"}):
        with pytest.raises(ValidationError):
            Thing.model_validate(bad)
