"""FSDP2 against DDP on two CPU processes (gloo), without Ray: the same losses step for step,
and a sharded checkpoint that a freshly initialised sharded model resumes from exactly."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from swarm_contracts.jobs import LoraSpec, TrainingSpec
from swarm_trainer import checkpoint
from swarm_trainer.model import build_model
from swarm_trainer.sharding import SHARDED
from swarm_trainer.train_state import TrainState

pytestmark = pytest.mark.slow

STEPS = 4
LORA = LoraSpec(r=8, alpha=16, dropout=0.0, target_modules="all-linear")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def train(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int, steps: range
) -> list[float]:
    """Each rank trains on its own batches; the loss reported is the mean over ranks."""
    losses = []
    for step in steps:
        gen = torch.Generator().manual_seed(1000 * step + rank)
        ids = torch.randint(0, 100, (2, 12), generator=gen)
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / dist.get_world_size())
    return losses


def setup(model_dir: Path, strategy: str, seed: int) -> tuple[torch.nn.Module, torch.optim.AdamW]:
    torch.manual_seed(seed)
    peft_model = build_model(model_dir, LORA, TrainingSpec())
    if strategy == "fsdp":
        model = SHARDED.wrap(peft_model)
    else:
        model = torch.nn.parallel.DistributedDataParallel(peft_model)
    params = [p for p in model.parameters() if p.requires_grad]
    return model, torch.optim.AdamW(params, lr=1e-2)


def worker(rank: int, port: int, model_dir: Path, out: Path) -> None:
    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        ddp, ddp_opt = setup(model_dir, "ddp", seed=0)
        ddp_losses = train(ddp, ddp_opt, rank, range(STEPS))

        fsdp, opt = setup(model_dir, "fsdp", seed=0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
        fsdp_losses = train(fsdp, opt, rank, range(2))
        # A checkpoint as the recipe writes it: gathered on every rank, written by rank 0.
        lora_state = SHARDED.lora_state(fsdp)
        optimizer_state = SHARDED.optimizer_state(fsdp, opt)
        if rank == 0:
            checkpoint.save_checkpoint(
                out,
                fsdp,
                optimizer_state,
                scheduler,
                TrainState(step=2),
                lora_state,
            )
        dist.barrier()
        fsdp_losses += train(fsdp, opt, rank, range(2, STEPS))
        final = SHARDED.adapter_weights(fsdp)

        # Another LoRA initialisation, restored from the checkpoint, then the last steps.
        fresh, fresh_opt = setup(model_dir, "fsdp", seed=1)
        fresh_scheduler = torch.optim.lr_scheduler.LambdaLR(fresh_opt, lambda _: 1.0)
        checkpoint.load_checkpoint(out, fresh, fresh_opt, fresh_scheduler, SHARDED)
        resumed_losses = train(fresh, fresh_opt, rank, range(2, STEPS))
        resumed = SHARDED.adapter_weights(fresh)
        if rank == 0:
            result = json.dumps(
                {
                    "ddp": ddp_losses,
                    "fsdp": fsdp_losses,
                    "resumed": resumed_losses,
                    "drift": max(float((final[k] - resumed[k]).abs().max()) for k in final),
                    "keys": sorted(final),
                }
            )
            (out / "result.json").write_text(result)
    finally:
        dist.destroy_process_group()


def test_fsdp_matches_ddp_and_resumes_exactly(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The spawned processes import ``worker`` from this module by its name (tests.trainer...),
    # with the parent's sys.path: the repository root must be on it (pytest's importlib mode,
    # under xdist too, does not put it there).
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    mp.spawn(worker, args=(free_port(), tiny_model_dir, tmp_path), nprocs=2)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["fsdp"] == pytest.approx(result["ddp"], abs=1e-4)
    assert result["resumed"] == pytest.approx(result["fsdp"][2:], abs=1e-6)
    assert result["drift"] < 1e-6
    # The adapter layout PEFT saves (lora_A/lora_B per target, no adapter name in the keys).
    assert result["keys"]
    assert all(".default." not in k for k in result["keys"])
