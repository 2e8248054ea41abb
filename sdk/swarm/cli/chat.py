"""``swarm chat``: one answer or an interactive session with an adapter or a base model."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from swarm.cli.output import JsonOpt, out
from swarm.cli.session import client, run
from swarm.client import Client, SwarmError
from swarm.completions import as_messages


def stream_answer(c: Client, model: str, messages: list[dict[str, Any]], **options: Any) -> str:
    """Print the answer as it streams in; return it whole."""
    parts: list[str] = []
    for chunk in c.chat_stream(model, messages, **options):
        if chunk.text:
            parts.append(chunk.text)
            # Plain stdout, unstyled: the model's text, exactly, for pipes as for terminals.
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    sys.stdout.write("\n")
    return "".join(parts)


def chat(
    model: Annotated[
        str, typer.Argument(help="an adapter (bot, bot@3, bot@production) or a base model")
    ],
    prompt: Annotated[
        str | None,
        typer.Option("--prompt", "-p", help="send this one message, print the answer, exit"),
    ] = None,
    system: Annotated[str | None, typer.Option(help="a system message, sent first")] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", min=1)] = None,
    temperature: Annotated[float | None, typer.Option(min=0.0, max=2.0)] = None,
    top_p: Annotated[float | None, typer.Option("--top-p", min=0.0, max=1.0)] = None,
    seed: Annotated[int | None, typer.Option(help="same seed, same sample")] = None,
    stop: Annotated[
        list[str] | None, typer.Option("--stop", help="stop string (repeatable)")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Chat with an adapter or a base model; the answer streams as it is generated.

    Without --prompt: an interactive session that keeps the conversation (/reset forgets
    it, /exit or Ctrl-D ends it). With --prompt: one answer, then exit (--json: the whole
    answer as JSON, with usage)."""
    c = client()
    options: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "seed": seed,
        "stop": stop or None,
    }
    if prompt is not None:
        if as_json:
            out.json(run(lambda: c.chat(model, prompt, system=system, **options)))
        else:
            run(lambda: stream_answer(c, model, as_messages(prompt, system), **options))
        return
    if as_json:
        out.error("--json needs --prompt (an interactive chat is not JSON)")
    converse(c, model, system, options)


def converse(c: Client, model: str, system: str | None, options: dict[str, Any]) -> None:
    """The interactive session: each answer streams in and joins the conversation; a refused
    message is shown and forgotten, and the session goes on."""
    history: list[dict[str, Any]] = []
    out.err.print(
        f"chatting with [bold]{model}[/] (/reset forgets the conversation, /exit ends it)"
    )
    while True:
        try:
            line = out.console.input("[bold cyan]you>[/] ")
        except (EOFError, KeyboardInterrupt):
            out.err.print()
            return
        text = line.strip()
        if text in ("/exit", "/quit"):
            return
        if text == "/reset":
            history.clear()
            continue
        if not text:
            continue
        history.append({"role": "user", "content": line})
        try:
            answer = stream_answer(c, model, as_messages(history, system), **options)
        except SwarmError as exc:
            out.err.print(f"[red]error:[/] {exc}")
            history.pop()
            continue
        history.append({"role": "assistant", "content": answer})
