"""Following a job in the terminal: a live progress bar fed by the job's event stream."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from swarm.client import Client
from swarm.sse import JobStreamEvent
from swarm_contracts.evals import EvalResult
from swarm_contracts.jobs import JobRecord


@dataclass
class Evaluated:
    """One ``validated`` event of a job with task evals."""

    eval_loss: float
    evals: EvalResult


@dataclass
class FollowResult:
    record: JobRecord
    eval_loss: float | None
    # The task evaluations seen, in order (step 0: the base model's baseline).
    evaluations: list[Evaluated] = field(default_factory=list)


def eta(progress: dict) -> str:
    """Time left at the attempt's pace so far, from the trainer's own step clock.

    The trainer's ``elapsed_s`` counts from the attempt's start, so after a resume the pace
    covers the steps run since ``resumed_from_step`` only approximately; good enough for a bar.
    """
    step, total = progress.get("step"), progress.get("max_steps")
    elapsed = progress.get("elapsed_s")
    if not step or not total or not elapsed:
        return "-"
    left = max(0.0, (total - step) * elapsed / step)
    return str(timedelta(seconds=round(left)))


def task_metrics(metrics: dict[str, float], values: dict[str, float] | None = None) -> str:
    """``exact_match 0.93  contains 1.00``: the task evals' metrics (named by ``metrics``),
    their values from ``values`` when given (a finished job's record: the adapter kept)."""
    values = metrics if values is None else values
    return "  ".join(f"{m} {values[m]:.2f}" for m in metrics if m in values)


def event_time(ev: JobStreamEvent) -> datetime | None:
    """When the event happened (its CloudEvent ``time``), if it says."""
    raw = ev.data.get("time")
    try:
        return datetime.fromisoformat(raw) if isinstance(raw, str) else None
    except ValueError:
        return None


class FirstStep:
    """Time to first step, what a user waits for (placement, model fetch, Ray's start): from
    the job's ``queued`` event to its first ``progress``, said once."""

    def __init__(self) -> None:
        self.queued_at: datetime | None = None
        self.said = False

    def line(self, ev: JobStreamEvent) -> str | None:
        if ev.event == "queued" and self.queued_at is None:
            self.queued_at = event_time(ev)
        if ev.event != "progress" or self.said:
            return None
        self.said = True
        stepped_at = event_time(ev)
        if self.queued_at is None or stepped_at is None:
            return None
        waited = (stepped_at - self.queued_at).total_seconds()
        return f"  first step {waited:.1f} s after it was queued"


def moved(ev: JobStreamEvent, job_id: str) -> str | None:
    """A line for an event that says where the job's run stands (a checkpoint, a requeue, a
    pause or resume); None for another event."""
    p = ev.payload
    match ev.event:
        case "checkpoint":
            return f"  checkpoint at step {p.get('step')}"
        case "requeued":
            return f"  [yellow]requeued[/]: {p.get('reason')}"
        case "paused":
            # The stream goes on: a resume continues the job, and the run with it.
            at = p.get("last_checkpoint_step")
            where = f" at the checkpoint of step {at}" if at else ""
            return f"  [yellow]paused[/]{where}: resume with `swarm jobs resume {job_id}`"
        case "resumed":
            return "  resumed"
    return None


def follow(client: Client, job_id: str, console: Console) -> FollowResult:
    """Show the job's progress until it ends; return its final record and last eval loss."""
    eval_loss: float | None = None
    evaluations: list[Evaluated] = []
    progress = Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[tps]} tok/s"),
        TextColumn("eval {task.fields[eval]}"),
        TextColumn("{task.fields[task]}"),
        TimeElapsedColumn(),
        TextColumn("eta {task.fields[eta]}"),
        console=console,
        transient=False,
    )
    with progress:
        task = progress.add_task(job_id, total=None, loss="-", tps="-", eval="-", eta="-", task="")
        first_step = FirstStep()
        for ev in client.events(job_id):
            p = ev.payload
            if (line := first_step.line(ev)) is not None:
                progress.console.print(line)
            if (line := moved(ev, job_id)) is not None:
                progress.console.print(line)
            if ev.event == "progress":
                progress.update(
                    task,
                    description="training",
                    total=p.get("max_steps"),
                    completed=p.get("step", 0),
                    loss=f"{p.get('loss', 0.0):.4f}",
                    tps=f"{p.get('tokens_per_s', 0.0):,.0f}",
                    eta=eta(p),
                )
            elif ev.event == "validated":
                eval_loss = float(p.get("eval_loss", 0.0))
                evals = p.get("evals") or {}
                if evals:
                    evaluations.append(Evaluated(eval_loss, EvalResult.model_validate(evals)))
                progress.update(
                    task, eval=f"{eval_loss:.4f}", task=task_metrics(evals.get("metrics", {}))
                )
            elif ev.event == "checkpoint":
                continue  # said above (``moved``): the job runs on
            elif (meaning := ev.meaning) and meaning.state_after and not meaning.terminal:
                # The job moved on (queued, assigned, started, paused, resumed...): say so,
                # and where.
                where = p.get("worker_id")
                progress.update(task, description=ev.event + (f" on {where}" if where else ""))
                if ev.event == "started" and p.get("resumed_from_step"):
                    progress.console.print(f"  resumed from step {p['resumed_from_step']}")
            elif ev.terminal:
                progress.update(task, description=ev.event)
    record = client.get_job(job_id)
    if eval_loss is None and "eval_loss" in record.metrics:
        eval_loss = record.metrics["eval_loss"]
    return FollowResult(record=record, eval_loss=eval_loss, evaluations=evaluations)


def report(result: FollowResult, console: Console) -> int:
    """Print how the job ended; return the process exit code (1 unless it succeeded)."""
    record = result.record
    if record.state == "succeeded":
        adapter = record.adapter
        name = f"{adapter.name} v{adapter.version}" if adapter else "(no adapter recorded)"
        loss = f"{result.eval_loss:.4f}" if result.eval_loss is not None else "n/a"
        task = task_metrics(record.evals.metrics if record.evals else {}, record.metrics)
        console.print(
            f"[bold green]succeeded[/]: adapter {name}, eval loss {loss}"
            + (f", {task}" if task else "")
        )
        return 0
    reason = f": {record.reason}" if record.reason else ""
    console.print(f"[bold red]{record.state}[/]{reason}")
    return 1
