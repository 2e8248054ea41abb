"""`make cookbook`: a tinker-cookbook recipe, unchanged, trains against a private Swarm stack.

The recipe is `tinker_cookbook.recipes.sl_basic` (supervised fine-tuning with the cookbook's
own training loop, `tinker_cookbook.supervised.train`), run as its README says, with the base
URL and key of the local gateway. What differs from a run against Thinking Machines is only
what this machine lacks, the Hugging Face Hub:

* the data: the cookbook's own `example_data/conversations.jsonl` through its
  `FromConversationFileBuilder` (the recipe's default, No Robots, is a Hub dataset), chosen on
  the recipe's command line as the recipe itself documents;
* the model: Swarm's tiny Llama (swarm_trainer.tiny_model), registered with the Hugging Face id
  `meta-llama/Llama-3.2-1B`, so the recipe names it as it would the real one; its tokenizer is
  put in a Hub cache of its own (``HF_HOME``, offline) under the id the cookbook loads every
  Llama 3 tokenizer from, and the `role_colon` renderer (the cookbook's recommended one for
  Llama-3.2-1B) renders the chats.

The cookbook lives in a venv of its own (`.venv-cookbook`): it pins torch and transformers
releases other than Swarm's. Checks that the recipe completes, that its loss falls over its
epochs and that its checkpoints (save_state and save_weights_for_sampler) were written;
exits non-zero otherwise. Not part of `make test` (it downloads the cookbook's dependencies,
torch included, on its first run). See docs/tinker.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console

from swarm.client import Client
from swarm.local_stack import LocalStack
from swarm_trainer.tiny_model import create_tiny_model

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-cookbook"
COOKBOOK = "tinker-cookbook==0.5.8"
HF_ID = "meta-llama/Llama-3.2-1B"
# tinker_cookbook.tokenizer_utils loads every meta-llama/Llama-3* tokenizer from this repo.
TOKENIZER_REPO = "thinkingmachineslabinc/meta-llama-3-instruct-tokenizer"
REVISION = "0" * 40


def cookbook_python() -> Path:
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", COOKBOOK], check=True)
    return python


def hub_cache(home: Path, model_dir: Path) -> None:
    """The tiny model's tokenizer where an offline Hub client looks for ``TOKENIZER_REPO``."""
    repo = home / "hub" / f"models--{TOKENIZER_REPO.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (model_dir / name).exists():
            shutil.copy(model_dir / name, snapshot / name)


def recipe(python: Path, url: str, log_path: Path, home: Path, epochs: int) -> list[float]:
    """Run sl_basic; its per-step train_mean_nll."""
    data = subprocess.run(
        [str(python), "-c", "import tinker_cookbook, pathlib; "
         "print(pathlib.Path(tinker_cookbook.__file__).parent / 'example_data')"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    common = "dataset_builder.common_config"
    args = [
        f"base_url={url}",
        f"model_name={HF_ID}",
        f"log_path={log_path}",
        "dataset_builder=tinker_cookbook.supervised.data:FromConversationFileBuilder",
        f"dataset_builder.file_path={data}/conversations.jsonl",
        f"{common}.model_name_for_tokenizer={HF_ID}",
        f"{common}.renderer_name=role_colon",
        f"{common}.batch_size=16",
        f"{common}.max_length=256",
        "lora_rank=8",
        "learning_rate=0.01",
        f"num_epochs={epochs}",
        "eval_every=0",
    ]
    env = os.environ | {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "TINKER_API_KEY": "tml-local"}
    run = subprocess.run(
        [str(python), "-m", "tinker_cookbook.recipes.sl_basic", *args],
        env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    (log_path / "recipe.log").write_text(run.stdout + run.stderr)
    if run.returncode != 0 or "Training completed successfully" not in run.stderr + run.stdout:
        raise SystemExit(
            f"the recipe failed ({run.returncode}):\n{(run.stdout + run.stderr)[-3000:]}"
        )
    lines = (log_path / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["train_mean_nll"] for line in lines if "train_mean_nll" in line]


def main() -> None:
    console = Console()
    python = cookbook_python()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_dir = create_tiny_model(root / "tiny-llama")
        hub_cache(root / "hf", model_dir)
        stack = LocalStack(
            root / "stack",
            free_ports=True,
            services=("gateway", "scheduler", "registry", "trainer"),
            console=Console(stderr=True, quiet=True),
            extra_env={"SWARM_BENCHMARK_S": "0"},
        )
        with stack:
            client = Client(base_url=stack.gateway_url)
            client.add_model("tiny-llama", model_dir, hf_id=HF_ID)
            client.close()
            log_path = root / "run"
            nll = recipe(python, stack.gateway_url, log_path, root / "hf", epochs=4)
            checkpoints = [json.loads(line) for line in (log_path / "checkpoints.jsonl").open()]
    steps_per_epoch = len(nll) // 4
    first, last = nll[:steps_per_epoch], nll[-steps_per_epoch:]
    console.print(f"sl_basic: {len(nll)} steps, train_mean_nll {nll[0]:.3f} -> {nll[-1]:.3f}")
    console.print(
        f"first epoch mean {sum(first) / len(first):.3f}, last {sum(last) / len(last):.3f}"
    )
    console.print(f"checkpoints: {[c['state_path'] for c in checkpoints]}")
    if not sum(last) < sum(first):
        raise SystemExit("the loss did not fall")
    if not any(c.get("sampler_path") for c in checkpoints):
        raise SystemExit("no weights were saved for sampling")


if __name__ == "__main__":
    main()
