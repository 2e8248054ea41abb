"""``swarm demo``: the whole flow on one machine, from a tiny model to a registered adapter,
ending with the base model's and the adapter's answers to the same prompts."""

from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from swarm.client import Client, SwarmError
from swarm.demo_data import write_demo_datasets
from swarm.local_stack import LocalStack, StackError
from swarm.progress import follow, report
from swarm.tiny_model import create_tiny_model

BASE_MODEL = "tiny-llama"
ADAPTER = "demo-adapter"
# Prompts of the demo's task (swarm.demo_data): the adapter learned them, the base did not.
PROMPTS = ("reverse moon ->", "add 3 4 ->")
SERVED_TIMEOUT_S = 90.0


def wait_until_served(c: Client, name: str, version: int, timeout: float) -> bool:
    """Whether an inference worker holds base model ``name@version`` within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        for entry in c.served_models():
            if (entry.get("kind"), entry.get("name"), entry.get("version")) == (
                "base_model",
                name,
                version,
            ) and entry.get("served"):
                return True
        if time.monotonic() > deadline:
            return False
        time.sleep(1.0)


def compare_answers(c: Client, base: str, adapter: str, console: Console) -> None:
    """The base model's and the adapter's greedy answers to the same prompts, side by side."""
    name, _, version = base.partition("@")
    if not wait_until_served(c, name, int(version), SERVED_TIMEOUT_S):
        console.print(f"[yellow]no inference worker serves {base}: skipping the answers[/]")
        return
    table = Table(title="the same prompts, before and after fine-tuning")
    for column in ("prompt", f"base {base}", f"adapter {adapter}"):
        table.add_column(column)
    for prompt in PROMPTS:
        answers = [
            c.complete(model, prompt, max_tokens=12, temperature=0.0, stop="\n").text
            for model in (base, adapter)
        ]
        # Text, not markup: a model's answer may hold "[...]" that rich would eat.
        table.add_row(Text(prompt), *(Text(repr(a)) for a in answers))
    console.print(table)
    console.print(f"chat with it: [bold]swarm chat {adapter}[/]")


def demo_spec(dataset: str, validation: str, steps: int) -> dict[str, object]:
    return {
        "name": ADAPTER,
        "base_model": BASE_MODEL,
        "dataset": dataset,
        "validation": validation,
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0},
        "training": {
            "max_steps": steps,
            "batch_size": 8,
            "lr": 2e-3,
            "warmup_steps": 5,
            "seq_len": 64,
            "eval_every": 20,
            "checkpoint_every": 20,
        },
        "resources": {"workers": 1, "cpus_per_worker": 1},
    }


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
            if not (model_dir / "config.json").exists():
                console.print("creating a tiny base model…")
                create_tiny_model(model_dir)
            model = c.add_model(BASE_MODEL, model_dir)
            console.print(f"base model [bold]{model.name}@{model.version}[/]")

            train_path, val_path = write_demo_datasets(root.resolve() / "data")
            train = c.upload_dataset(train_path)
            val = c.upload_dataset(val_path)
            console.print(f"datasets: train {train.id} ({train.examples}), val {val.id}")

            record = c.submit(
                demo_spec(train.id, val.id, steps), idempotency_key=f"demo-{uuid.uuid4().hex}"
            )
            console.print(f"job [bold]{record.job_id}[/] submitted")
            result = follow(c, record.job_id, console)
            code = report(result, console)
            if code == 0 and result.record.adapter is not None:
                adapter = c.get_adapter(result.record.adapter.name, result.record.adapter.version)
                console.print(
                    f"registered adapter {adapter.name} v{adapter.version} at {adapter.store_key}"
                    f" (base {adapter.lineage.base_model}@{adapter.lineage.base_model_version},"
                    f" eval_loss {adapter.lineage.metrics.get('eval_loss', 'n/a')})"
                )
                compare_answers(
                    c,
                    f"{adapter.lineage.base_model}@{adapter.lineage.base_model_version}",
                    f"{adapter.name}@{adapter.version}",
                    console,
                )
            return code
        except SwarmError as exc:
            console.print(f"[red]demo failed:[/] {exc}")
            return 1
