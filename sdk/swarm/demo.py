"""``swarm demo``: the whole flow on one machine, from a tiny model to a registered adapter."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

from rich.console import Console

from swarm.client import Client, SwarmError
from swarm.demo_data import write_demo_datasets
from swarm.local_stack import LocalStack, StackError
from swarm.progress import follow, report

BASE_MODEL = "tiny-llama"
ADAPTER = "demo-adapter"


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
    from swarm.cli import create_tiny_model

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
            return code
        except SwarmError as exc:
            console.print(f"[red]demo failed:[/] {exc}")
            return 1
