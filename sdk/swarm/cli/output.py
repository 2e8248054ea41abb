"""What the CLI prints: a command's result as JSON for scripts or as tables and lines for
people, event streams, and errors as one red line with an exit code."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from swarm.sse import JobStreamEvent

T = TypeVar("T")
Command = TypeVar("Command", bound=Callable[..., None])

JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable JSON output")]
AfterOpt = Annotated[str | None, typer.Option("--after", help="only events after this event id")]

Data = BaseModel | Sequence[Any] | dict[str, Any]

# Columns whose values are meant to be copied whole (ids, names, keys).
ID_COLUMNS = frozenset({"id", "name", "job", "worker", "public key"})
# The narrowest a wrapped column may get before a table reads better as one block per row.
WRAPPED_MIN = 8


class Output:
    """The consoles every command prints through: one object, so that a test can swap in a
    console of its own width for all of them at once."""

    def __init__(self) -> None:
        self.console = Console()
        self.err = Console(stderr=True)

    def json(self, data: Data) -> None:
        if isinstance(data, BaseModel):
            obj: Any = data.model_dump(mode="json")
        elif isinstance(data, dict):
            obj = data
        else:
            obj = [d.model_dump(mode="json") if isinstance(d, BaseModel) else d for d in data]
        # Plain print: rich would wrap and colour the JSON, which breaks pipes into jq.
        print(json.dumps(obj, indent=2))

    def result(self, data: Data, as_json: bool, message: str) -> None:
        """A command's outcome: the data as JSON for scripts, else one line for people."""
        if as_json:
            self.json(data)
        else:
            self.console.print(message)

    def listing(
        self,
        found: Sequence[T],
        as_json: bool,
        title: str,
        columns: Sequence[str],
        row: Callable[[T], Sequence[Any]],
    ) -> None:
        """A list command's output: JSON for scripts, else a table with one row per item."""
        if as_json:
            self.json(found)
        else:
            self.table(title, columns, [row(item) for item in found])

    def table(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """A table that never cuts an id, however narrow the terminal: an id column is as wide
        as its longest value and never wraps, the other columns wrap to make room; where even
        that does not fit, each row is printed as a block of ``column: value`` lines."""
        console = self.console
        cells = [["" if v is None else str(v) for v in r] for r in rows]
        is_id = [i == 0 or c in ID_COLUMNS for i, c in enumerate(columns)]
        widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
        needed = sum(
            w if ident else min(w, WRAPPED_MIN) for w, ident in zip(widths, is_id, strict=True)
        )
        if needed + 3 * len(columns) + 1 > console.width:
            if title:
                console.print(f"[bold]{title}[/]")
            for r in cells:
                console.print(r[0], markup=False)
                for c, v in zip(columns[1:], r[1:], strict=True):
                    if v:
                        console.print(f"  {c}: {v}", markup=False, soft_wrap=False)
            return
        t = Table(title=title)
        for c, ident, w in zip(columns, is_id, widths, strict=True):
            if ident:
                t.add_column(c, no_wrap=True, min_width=w)
            else:
                t.add_column(c, overflow="fold", min_width=min(w, WRAPPED_MIN))
        for r in cells:
            t.add_row(*r)
        console.print(t)

    def events(self, events: Iterator[JobStreamEvent], as_json: bool) -> None:
        """A job's or sweep's events as they come: one line each, or with ``as_json`` one JSON
        object per line (JSON Lines, so that a pipe sees each at once): the CloudEvent plus
        "seq", the id to resume after (--after)."""
        for ev in events:
            if as_json:
                print(json.dumps({**ev.data, "seq": ev.id}), flush=True)
            else:
                self.console.print(event_line(ev), highlight=False, markup=False)

    def fail(self, message: str, code: int = 2) -> NoReturn:
        """Print ``message`` (rich markup) on stderr and exit with ``code``."""
        self.err.print(message)
        raise typer.Exit(code)

    def error(self, message: object) -> NoReturn:
        """A refused or failed command: ``error: ...`` and exit code 2, not a traceback."""
        self.fail(f"[red]error:[/] {message}")


def event_line(ev: JobStreamEvent) -> str:
    hidden = ("event", "job_id", "sweep_id", "spec")
    fields = {k: v for k, v in ev.payload.items() if k not in hidden}
    return f"{ev.id:>6} {ev.event:<10} " + " ".join(f"{k}={v}" for k, v in fields.items())


def lists_by_default(group: typer.Typer) -> Callable[[Command], Command]:
    """Make the decorated ``ls`` command what plain ``swarm <group>`` (no subcommand) runs,
    with its ``--json``."""

    def register(ls: Command) -> Command:
        @group.callback(invoke_without_command=True)
        def default(ctx: typer.Context, as_json: JsonOpt = False) -> None:
            if ctx.invoked_subcommand is None:
                ls(as_json=as_json)

        return ls

    return register


out = Output()
