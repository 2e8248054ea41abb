"""``swarm demo``: the whole flow on one machine, from a tiny pretrained model to a registered
adapter that does a task the base cannot (``demo_data``), measured by task evals: it ends with
held-out prompts, the base's and the adapter's answers, and each one's exact-match rate, and
exits 1 unless the adapter reached its target."""

from __future__ import annotations

import contextlib
import json
import uuid
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from swarm.client import Client, SwarmError
from swarm.demo_data import SCHEMA, question, write_demo_datasets
from swarm.local_stack import LocalStack, StackError
from swarm.progress import Evaluated, FollowResult, follow, report
from swarm.tiny_model import create_tiny_model

BASE_MODEL = "tiny-llama"
ADAPTER = "demo-adapter"


# What the demo must show (README): the base cannot do the task, the adapter can.
BASE_TARGET = 0.10
ADAPTER_TARGET = 0.80
METRIC = "exact_match"


def demo_spec(dataset: str, held_out: str, steps: int) -> dict[str, object]:
    return {
        "name": ADAPTER,
        "base_model": BASE_MODEL,
        "dataset": dataset,
        "validation": held_out,
        "lora": {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"},
        "training": {
            "max_steps": steps,
            "batch_size": 16,
            "lr": 1e-2,
            "warmup_steps": 10,
            "seq_len": 128,
            "eval_every": max(1, steps // 4),
            "checkpoint_every": steps,
            "packing": True,
        },
        # Graded on the held-out set (the validation set) at step 0 (the base model, since
        # a fresh adapter changes nothing), at each validation and at the end.
        "evals": {
            "graders": [
                {"type": "exact_match"},
                {"type": "json_valid", "schema": SCHEMA},
            ],
            "max_new_tokens": 48,
            "samples": 8,
            "select_by": METRIC,
        },
        "resources": {"workers": 1, "cpus_per_worker": 1},
    }


def adapter_evaluation(evaluations: list[Evaluated]) -> Evaluated | None:
    """The evaluation of the adapter the job kept: the trainer's rule for ``select_by``
    (highest metric, then lowest eval loss), over the steps after the baseline."""
    trained = [e for e in evaluations if e.evals.step > 0]
    if not trained:
        return None
    return max(trained, key=lambda e: (e.evals.metrics.get(METRIC, 0.0), -e.eval_loss))


def show_results(result: FollowResult, console: Console) -> int:
    """The held-out prompts with the base's and the adapter's answers, each one's exact-match
    rate; exit code 1 unless the adapter learned the task and the base could not do it."""
    base = next((e for e in result.evaluations if e.evals.step == 0), None)
    tuned = adapter_evaluation(result.evaluations)
    if base is None or tuned is None:
        console.print("[red]the job reported no task evals: cannot show what it learned[/]")
        return 1
    base_rate = base.evals.metrics.get(METRIC, 0.0)
    tuned_rate = tuned.evals.metrics.get(METRIC, 0.0)
    table = Table(title=f"held-out prompts ({tuned.evals.examples} in all; the first shown)")
    for column in ("prompt", "expected", "base", f"adapter (step {tuned.evals.step})"):
        table.add_column(column, overflow="fold")
    answers = {s.prompt: s for s in base.evals.samples}
    for row in tuned.evals.samples:
        before = answers.get(row.prompt)
        table.add_row(
            Text(row.prompt),
            Text(row.expected.strip()),
            mark(before.got if before else "", before.scores.get(METRIC) if before else None),
            mark(row.got, row.scores.get(METRIC)),
        )
    table.add_section()
    table.add_row(
        Text(f"{METRIC} rate"), Text(""), Text(f"{base_rate:.1%}"), Text(f"{tuned_rate:.1%}")
    )
    console.print(table)
    if tuned_rate < ADAPTER_TARGET or base_rate > BASE_TARGET:
        console.print(
            f"[red]targets missed[/]: base {base_rate:.0%} (at most {BASE_TARGET:.0%}), "
            f"adapter {tuned_rate:.0%} (at least {ADAPTER_TARGET:.0%})"
        )
        return 1
    console.print(
        f"[bold green]the adapter learned the task[/]: {METRIC} {base_rate:.1%} -> {tuned_rate:.1%}"
    )
    return 0


def mark(answer: str, score: float | None) -> Text:
    # Text, not markup: a model's answer may hold "[...]" that rich would eat.
    shown = Text(answer.strip() or "''")
    shown.stylize("green" if score else "red")
    return shown


def run_demo(
    url: str | None, api_key: str | None, *, steps: int, root: Path, console: Console
) -> int:
    with contextlib.ExitStack() as stack:
        c = Client(base_url=url, api_key=api_key)
        if c.healthy():
            console.print(f"using the gateway at {c.base_url}")
        else:
            console.print(f"no gateway at {c.base_url}: starting a local stack in {root}")
            try:
                local = stack.enter_context(LocalStack(root, free_ports=True, console=console))
            except StackError as exc:
                console.print(f"[red]{exc}[/]")
                return 1
            c = Client(base_url=local.gateway_url, api_key=api_key)
        stack.callback(c.close)
        try:
            model_dir = root.resolve() / "tiny-llama"
            console.print("a tiny base model, pretrained on a generated corpus (cached)…")
            create_tiny_model(model_dir)
            model = c.add_model(BASE_MODEL, model_dir)
            console.print(f"base model [bold]{model.name}@{model.version}[/]")

            train_path, held_out_path = write_demo_datasets(root.resolve() / "data")
            train = c.upload_dataset(train_path)
            held_out = c.upload_dataset(held_out_path)
            console.print(
                f"task: a sentence about a person -> JSON; datasets: train {train.id} "
                f"({train.examples}), held out {held_out.id} ({held_out.examples})"
            )

            record = c.submit(
                demo_spec(train.id, held_out.id, steps), idempotency_key=f"demo-{uuid.uuid4().hex}"
            )
            console.print(f"job [bold]{record.job_id}[/] submitted")
            result = follow(c, record.job_id, console)
            code = report(result, console)
            if code == 0 and result.record.adapter is not None:
                adapter = c.get_adapter(result.record.adapter.name, result.record.adapter.version)
                console.print(
                    f"registered adapter {adapter.name} v{adapter.version} at {adapter.store_key}"
                    f" (base {adapter.lineage.base_model}@{adapter.lineage.base_model_version},"
                    f" {METRIC} {adapter.lineage.metrics.get(METRIC, 'n/a')})"
                )
                code = show_results(result, console)
                console.print(
                    f"chat with it: [bold]swarm chat {adapter.name}@{adapter.version} -p "
                    f"'{held_out_example(held_out_path)}'[/]"
                )
            return code
        except SwarmError as exc:
            console.print(f"[red]demo failed:[/] {exc}")
            return 1


def held_out_example(path: Path) -> str:
    return question(json.loads(path.read_text(encoding="utf-8").splitlines()[0]))
