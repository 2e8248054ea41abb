"""The LoRA fine-tuning recipe that Ray Train runs on every rank.

``train_loop`` reads top to bottom: ``setup`` (model, adapter, data, optimizer, schedule),
``resume`` from the last committed checkpoint (weights, optimizer, schedule, RNG, data
position), ``train`` (steps with gradient accumulation and clipping; ``validate`` keeps the
best adapter; ``save_checkpoint`` through ``ray.train.report``), and ``finish``: rank 0 saves
the best adapter and the run's metrics to the run's output prefix. The step itself is in
``step``; the training set, streamed per rank and tokenized once, in ``stream``; what the
job's training method (SFT, DPO) makes of its data, its loss and its measures is in
``methods``; rank 0's reports to the agent are ``reports``.

Long because: the loop's phases share one ``Recipe`` and read in order, as one run does;
the step, the methods, the reports, sharding and checkpoints' files are their own modules.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray.train
import ray.train.torch
import torch
from peft import PeftModel
from transformers import AutoTokenizer

from swarm_contracts.datasets import DatasetInfo
from swarm_contracts.evals import EvalSpec
from swarm_contracts.jobs import TrainingSpec
from swarm_contracts.layout import output_adapter, output_replay, output_result
from swarm_contracts.workers import Assignment
from swarm_runtime.dataset_frames import DatasetFrames, local_frames, open_frames
from swarm_runtime.store import ObjectStore
from swarm_trainer import checkpoint, fetch, reports
from swarm_trainer.cache import TransferCache
from swarm_trainer.checkpoint import checkpoint_dir_name, save_adapter
from swarm_trainer.compute import Compute, choose_compute
from swarm_trainer.control import RELEASE
from swarm_trainer.data import Batch, StepBatches, Tokenizer, eval_batches, read_jsonl, shard
from swarm_trainer.hooks import LoopHooks
from swarm_trainer.loop_config import LoopConfig
from swarm_trainer.methods import Method, for_job
from swarm_trainer.model import build_model
from swarm_trainer.parent_adapter import starting_adapter
from swarm_trainer.replay import replay_report
from swarm_trainer.reporter import Reporter
from swarm_trainer.rng import load_rng, save_rng, seed_everything
from swarm_trainer.sharding import Sharding, for_strategy
from swarm_trainer.step import (
    all_reduce_max,
    all_reduce_sum,
    evaluate,
    lr_lambda,
    make_optimizer,
    train_step,
)
from swarm_trainer.stream import (
    FrameSource,
    Holdout,
    Share,
    TrainStream,
    held_out_rows,
    validation_examples,
)
from swarm_trainer.stream_position import load_position, save_position
from swarm_trainer.task_eval import EvalRow, eval_rows, run_evals
from swarm_trainer.token_cache import TokenCache, evict_entries, tokenizer_digest
from swarm_trainer.train_state import TrainState

# The worker's tokenized frames (``token_cache``): a directory of the transfer cache's, kept to
# a quarter of its size limit.
TOKENS_DIR = "tokens"
TOKENS_SHARE = 4


def train_loop(config: dict[str, Any]) -> None:
    """One rank of one run (``config`` as ``LoopConfig.for_ray`` made it)."""
    loop = LoopConfig.from_ray(config)
    # ``held``: the cache entries the run uses, kept from eviction until it ends.
    with workspace(loop) as work, contextlib.ExitStack() as held:
        recipe = setup(loop, work, held)
        state = resume(recipe, loop.resume_from)
        if train(recipe, state):
            # A replay (verification) compares what it reached; a job saves its adapter.
            (finish_replay if recipe.job.verify else finish)(recipe, state)


@dataclass
class Recipe:
    """Everything a rank set up for the run; ``TrainState`` is what changes as it trains."""

    job: Assignment
    rank: int
    world: int
    compute: Compute  # device, precision, attention, fused kernels
    store: ObjectStore
    work: Path
    sharding: Sharding  # resources.strategy: how the model is spread over the ranks
    model: torch.nn.Module  # what the step runs: the PEFT model, DDP-wrapped or FSDP-sharded
    peft_model: PeftModel  # the same model unwrapped: what is saved and evaluated
    method: Method  # spec.method: the data format, batch, loss and measures (SFT, DPO)
    stream: TrainStream  # this rank's share of the training set, streamed from the store
    batches: StepBatches  # its micro-batches, by data index, the next step's prepared ahead
    val_batches: list[Batch]
    eval_forwards: int  # evaluation runs at least this many forwards (ranks in lockstep)
    has_eval: bool  # some rank has validation data
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    reporter: Reporter
    hooks: LoopHooks
    fetched: Fetched  # how the base model and data came: from the cache or the store
    tokenizer: Tokenizer
    eval_rows: list[EvalRow]  # the task evals' held-out prompts (every rank has them all)
    train_started: float = 0.0  # time.monotonic() when ``train`` began

    @property
    def training(self) -> TrainingSpec:
        return self.job.spec.training

    @property
    def evals(self) -> EvalSpec | None:
        return self.job.spec.evals

    @property
    def device(self) -> torch.device:
        return self.compute.device

    @property
    def bf16(self) -> bool:
        return self.compute.bf16


@dataclass(frozen=True)
class Fetched:
    # Of "base_model", "validation", "evals": found in the machine's cache; "dataset": its
    # tokens found in the store's token cache.
    cached: tuple[str, ...]
    seconds: float  # getting them: downloading, or verifying the cached copies


@contextlib.contextmanager
def workspace(config: LoopConfig) -> Iterator[Path]:
    """This rank's scratch directory (model, data, checkpoints on their way out), removed at
    the end whatever happens."""
    rank = ray.train.get_context().get_world_rank()
    prefix = f"{config.assignment.job_id}-r{rank}-"
    with tempfile.TemporaryDirectory(
        prefix=prefix, dir=config.work_dir, ignore_cleanup_errors=True
    ) as work:
        yield Path(work)


# --- setup ---------------------------------------------------------------------------------


def setup(config: LoopConfig, work: Path, held: contextlib.ExitStack) -> Recipe:
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    job = config.assignment
    t = job.spec.training
    store = config.store.open()
    device = ray.train.torch.get_device()
    compute = choose_compute(t, device)
    seed_everything(t.seed)

    # Base model, tokenizer, validation and task-eval sets (small: they come whole) through
    # the machine's cache (from the store on a miss), held until the run ends; LoRA adapter
    # on top. Continuing training starts from the parent adapter's weights (a resumed attempt
    # then overwrites them with its checkpoint's). Every rank seeds alike, so all start from
    # the same weights (DDP also broadcasts rank 0's); ``sharding`` then wraps (ddp) or
    # shards (fsdp) the model.
    fetch_started = time.monotonic()
    cache = config.cache.open()
    model_entry = held.enter_context(fetch.base_model(cache, store, job.base_model))
    datasets = {
        name: held.enter_context(fetch.dataset(cache, store, info))
        for name, info in (("validation", job.validation), ("evals", job.eval_dataset))
        if info is not None
    }
    fetch_s = time.monotonic() - fetch_started
    model_dir = model_entry.path
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    parent_dir = starting_adapter(store, job, work / "parent")
    sharding = for_strategy(job.spec.resources.strategy)
    model = sharding.wrap(build_model(model_dir, job.spec.lora, t, parent_dir, compute, device))
    # DPO's reference is the model without its adapter, or with the parent's weights as loaded.
    method = for_job(job.spec.method, sharding.unwrap(model), from_parent=parent_dir is not None)

    # The training set streams from the store, tokenized once by the method into the store's
    # token cache (``stream``): opening it reads the cache entry's layout, or the dataset's.
    opening = time.monotonic()
    token_cache = TokenCache.of(
        store,
        job.dataset,
        tokenizer_digest(model_dir),
        t.seq_len,
        method.encoding,
        cache.root / TOKENS_DIR,
        # A worker without store keys reads the shared cache but never writes it (see
        # ``token_cache``).
        writable=config.store.signed is None,
        sequences=method.sequences,
    )
    evict_entries(cache.root / TOKENS_DIR, cache.max_bytes // TOKENS_SHARE, token_cache.local)
    source = FrameSource(
        token_cache,
        method,
        tokenizer,
        t.seq_len,
        lambda: dataset_frames(store, cache, job.dataset, held),
    )
    fetched = Fetched(
        cached=tuple(
            name
            for name, hit in (
                ("base_model", model_entry.hit),
                ("dataset", source.cached),
                *((name, entry.hit) for name, entry in datasets.items()),
            )
            if hit
        ),
        seconds=fetch_s + time.monotonic() - opening,
    )
    stream, val_batches, rows = load_data(
        job,
        method,
        tokenizer,
        source,
        datasets["validation"].path / fetch.DATASET_FILE if "validation" in datasets else None,
        rank,
        world,
        compute,
        datasets["evals"].path / fetch.DATASET_FILE if "evals" in datasets else None,
    )
    held.callback(stream.close)
    # A sharded forward is a collective: every rank evaluates as many batches as the most.
    eval_forwards = int(all_reduce_max(len(val_batches), device)) if sharding.lockstep else 0
    optimizer = make_optimizer((p for p in model.parameters() if p.requires_grad), t.lr, device)
    return Recipe(
        job=job,
        rank=rank,
        world=world,
        compute=compute,
        store=store,
        work=work,
        sharding=sharding,
        model=model,
        peft_model=sharding.unwrap(model),
        method=method,
        stream=stream,
        batches=StepBatches(stream, t.grad_accum, device),
        val_batches=val_batches,
        eval_forwards=eval_forwards,
        has_eval=bool(rows) or bool(all_reduce_sum([float(len(val_batches))], device)[0]),
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_lambda(t.warmup_steps, t.max_steps)
        ),
        reporter=Reporter(config.control, rank),
        hooks=config.hooks,
        fetched=fetched,
        tokenizer=tokenizer,
        eval_rows=rows,
    )


def dataset_frames(
    store: ObjectStore, cache: TransferCache, info: DatasetInfo, held: contextlib.ExitStack
) -> DatasetFrames:
    """The stored training set by frames, read with byte ranges. Gzip, or zstd stored before
    frames, cannot be cut: then a local plain copy, through the machine's cache."""
    frames = open_frames(store, info.store_key)
    if frames is None:
        entry = held.enter_context(fetch.dataset(cache, store, info))
        frames = local_frames(entry.path / fetch.DATASET_FILE)
    return frames


def load_data(
    job: Assignment,
    method: Method,
    tokenizer: Tokenizer,
    source: FrameSource,
    val_file: Path | None,
    rank: int,
    world: int,
    compute: Compute,
    eval_file: Path | None = None,
) -> tuple[TrainStream, list[Batch], list[EvalRow]]:
    """(this rank's training stream, its validation batches, the task evals' rows). The
    held-out records are drawn before sharding, so every rank agrees on what is held out;
    then each rank streams its own share of the training set (``stream``), which the method
    encodes.

    The task evals' rows are their own dataset, or ``evals.fraction`` of the training set
    (held out first), or else the validation set. Without a validation set of its own, an
    SFT job's eval loss is measured on the task evals' rows (a DPO job's needs preference
    pairs, which task evals need not be)."""
    t = job.spec.training
    evals = job.spec.evals
    holdout = Holdout(
        val_fraction=0.0 if val_file is not None else t.val_fraction,
        eval_fraction=evals.fraction if evals is not None and eval_file is None else None,
        seed=t.seed,
    )
    share = Share.of(source.count, rank, world)
    rows: list[EvalRow] = []
    if evals is not None:
        if eval_file is not None:
            rows = eval_rows(read_jsonl(eval_file), evals.max_examples)
        elif holdout.eval_fraction is None and val_file is not None:
            rows = eval_rows(read_jsonl(val_file), evals.max_examples)
        else:
            rows = held_out_rows(source, holdout, evals.max_examples)
    # The validation loss: the validation dataset, else the held-out val_fraction, else (SFT)
    # the task evals' own dataset, else their held-out fraction.
    evals_too = method.name == "sft"
    held_file = val_file
    if val_file is None and t.val_fraction <= 0 and evals_too:
        held_file = eval_file
    if held_file is not None:
        val_records = read_jsonl(held_file)
        val_examples = (
            method.encode(shard(val_records, rank, world), tokenizer, t.seq_len)
            if len(val_records) >= world
            else []
        )
    else:
        val_examples = validation_examples(source, share, holdout, evals=evals_too)
    pad_id = pad_token_id(tokenizer)
    # A packed micro-batch holds every sequence of its examples (DPO: two per example).
    pack_to = compute.packed_row(t.seq_len, t.batch_size * method.sequences) if t.packing else None
    stream = TrainStream(source, share, holdout, t.batch_size, pad_id, t.seed + rank, pack_to)
    return stream, eval_batches(val_examples, t.batch_size, pad_id, method.collate), rows


def pad_token_id(tokenizer: Tokenizer) -> int:
    if tokenizer.pad_token_id is not None:
        return tokenizer.pad_token_id
    return tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0


def resume(recipe: Recipe, earlier_attempt: ray.train.Checkpoint | None) -> TrainState:
    """From the latest *committed* checkpoint: this run's own (Ray hands out only those) after
    a retry, else the one an earlier attempt committed (the run's copy of it, see
    ``resume_point.prepare_resume``). Weights, optimizer, schedule, this rank's RNG streams and
    the data position, so the run continues as if it had never stopped."""
    found = ray.train.get_checkpoint() or earlier_attempt
    if found is None:
        return TrainState()
    with found.as_directory() as d:
        state = checkpoint.load_checkpoint(
            Path(d), recipe.model, recipe.optimizer, recipe.scheduler, recipe.sharding
        )
        load_rng(Path(d), recipe.rank)
        position = load_position(
            Path(d), recipe.rank, recipe.world, state.data_index, recipe.job.dataset.sha256
        )
    recipe.stream.seek(state.data_index, position)
    return state


# --- train ---------------------------------------------------------------------------------


def train(recipe: Recipe, state: TrainState) -> bool:
    """Step to ``max_steps``, validating and checkpointing on their schedules; False when a
    stop request ended it: a cancel saves nothing more, a release (the job is handed back)
    first commits a checkpoint of the current step unless it has one already.

    A replay steps to its target's ``to_step`` only (the schedule still spans ``max_steps``),
    keeping each step's loss; it neither validates (evaluation changes no weights) nor
    checkpoints (Ray's retry of a crashed replay starts it again from the target's)."""
    t = recipe.training
    replay = recipe.job.verify is not None
    end = recipe.job.verify.to_step if recipe.job.verify is not None else t.max_steps
    recipe.reporter.send(
        reports.Started(
            resumed_from_step=state.step,
            cached=recipe.fetched.cached,
            fetch_s=recipe.fetched.seconds,
        )
    )
    recipe.model.train()
    recipe.train_started = time.monotonic()
    saved_step = state.step  # a resumed run starts from a committed checkpoint
    if recipe.evals is not None and state.step == 0 and not replay:
        # A fresh LoRA adapter changes nothing yet (its B matrices are zero): step 0's task
        # evals are the base model's (or the parent adapter's) score, the baseline to beat.
        validate(recipe, state)
    while state.step < end:
        recipe.hooks.before_step(recipe, state)
        if mode := recipe.reporter.stop_mode(recipe.device):
            if mode == RELEASE and state.step > saved_step and not replay:
                save_checkpoint(recipe, state, {"step": state.step})
            recipe.reporter.send(reports.Cancelled(step=state.step))
            return False
        metrics = step(recipe, state)
        if replay:
            state.losses[state.step] = metrics["loss"]
            continue
        last = state.step == t.max_steps
        if recipe.has_eval and (state.step % t.eval_every == 0 or last):
            metrics |= validate(recipe, state)
        if state.step % t.checkpoint_every == 0 or last:
            save_checkpoint(recipe, state, metrics)
            saved_step = state.step
    recipe.hooks.after_training(recipe)
    return True


def step(recipe: Recipe, state: TrainState) -> dict[str, float]:
    """One optimizer step over ``grad_accum`` micro-batches; its metrics for Ray."""
    t = recipe.training
    started = time.monotonic()
    lr = recipe.scheduler.get_last_lr()[0]
    out = train_step(
        recipe.model,
        recipe.batches.take(state.data_index),
        recipe.optimizer,
        recipe.scheduler,
        t.max_grad_norm,
        recipe.device,
        recipe.bf16,
        select_logits=not recipe.compute.liger,
        method=recipe.method,
    )
    # The step is queued on the GPU; the host collates and sends the next one meanwhile,
    # then reads the loss (the step's one wait for the GPU).
    recipe.batches.prefetch(state.data_index + t.grad_accum)
    state.stepped(out.loss, t.grad_accum)
    measures = recipe.method.step_metrics(out.stats, out.total) if out.stats is not None else {}
    recipe.hooks.after_step(recipe, out)
    took = time.monotonic() - started
    recipe.reporter.send(
        reports.Progress(
            step=state.step,
            max_steps=t.max_steps,
            loss=out.loss,
            lr=lr,
            tokens_per_s=out.tokens * recipe.world / max(took, 1e-9),
            elapsed_s=time.monotonic() - recipe.train_started,
            step_s=took,
            metrics=measures,
        )
    )
    return {"step": state.step, "loss": out.loss}


def validate(recipe: Recipe, state: TrainState) -> dict[str, float]:
    """Evaluate on every rank's validation shard, and run the task evals; the adapter a job
    registers is its best (by eval loss, or by ``evals.select_by``), not its last, so the best
    weights are kept.

    Every rank generates on all the eval rows, the same greedy work on the same weights (a
    sharded model's forward is a collective), so all ranks agree on which step is best."""
    started = time.monotonic()
    evaluated = evaluate(
        recipe.peft_model,
        recipe.val_batches,
        recipe.device,
        recipe.bf16,
        recipe.eval_forwards,
        recipe.method,
    )
    eval_loss, perplexity = evaluated.loss, evaluated.perplexity
    task = None
    if recipe.evals is not None and recipe.eval_rows:
        task = run_evals(
            recipe.peft_model,
            recipe.tokenizer,
            recipe.evals,
            recipe.eval_rows,
            state.step,
            recipe.device,
            recipe.bf16,
        )
    took = time.monotonic() - started
    evaluation = reports.Evaluation(
        step=state.step,
        eval_loss=eval_loss,
        perplexity=perplexity,
        task=dict(task.metrics) if task else {},
    )
    select_by = recipe.evals.select_by if recipe.evals is not None else None
    if state.evaluated(evaluation, select_by):
        state.best_weights = recipe.sharding.adapter_weights(recipe.peft_model)
        state.best_evals = task
    recipe.reporter.send(
        reports.Validated(
            step=state.step,
            eval_loss=eval_loss,
            perplexity=perplexity,
            eval_s=took,
            evals=task.model_dump_json() if task else None,
            metrics=evaluated.metrics,
        )
    )
    return {"eval_loss": eval_loss, "perplexity": perplexity, **evaluation.task}


def save_checkpoint(recipe: Recipe, state: TrainState, metrics: dict[str, float]) -> None:
    """Every rank calls ``ray.train.report`` (a barrier) with its RNG state; rank 0 adds the
    rest. Ray copies all ranks' files into one directory and commits it only after every rank
    has reported. The adapter and optimizer state are gathered on every rank first (shards
    under fsdp, so a collective); rank 0 writes them whole."""
    started = time.monotonic()
    recipe.hooks.before_checkpoint(recipe, state)
    name = checkpoint_dir_name(state.step)
    lora_state = recipe.sharding.lora_state(recipe.peft_model)
    optimizer_state = recipe.sharding.optimizer_state(recipe.model, recipe.optimizer)
    with tempfile.TemporaryDirectory(dir=recipe.work) as tmp:
        directory = Path(tmp)
        if recipe.rank == 0:
            checkpoint.save_checkpoint(
                directory,
                recipe.peft_model,
                optimizer_state,
                recipe.scheduler,
                state,
                lora_state,
            )
        save_rng(directory, recipe.rank)
        save_position(
            directory,
            recipe.rank,
            recipe.world,
            state.data_index,
            recipe.stream.position(state.data_index),
            recipe.job.dataset.sha256,
        )
        ray.train.report(
            metrics,
            checkpoint=ray.train.Checkpoint.from_directory(directory),
            checkpoint_dir_name=name,
        )
    recipe.reporter.send(
        reports.CheckpointReported(
            step=state.step, dir_name=name, upload_s=time.monotonic() - started
        )
    )


# --- finish --------------------------------------------------------------------------------


def finish(recipe: Recipe, state: TrainState) -> None:
    """Rank 0 puts the best adapter and the run's ``TrainMetrics`` in the store. It may be on
    another node than the agent, so they go straight to the store; the agent reads the small
    metrics file. Every rank restores the best weights and gathers them (fsdp: a collective)."""
    started = time.monotonic()
    if state.best_weights is not None:
        recipe.sharding.set_adapter_weights(recipe.peft_model, state.best_weights)
    lora_state = recipe.sharding.lora_state(recipe.peft_model)
    if recipe.rank != 0:
        return
    job, store = recipe.job, recipe.store
    out_dir = recipe.work / "adapter"
    save_adapter(recipe.peft_model, out_dir, job.base_model.reference, lora_state)
    store.upload_dir(out_dir, output_adapter(job.job_id, job.attempt))
    metrics = state.metrics(elapsed_s=time.monotonic() - recipe.train_started)
    store.put_bytes(output_result(job.job_id, job.attempt), metrics.model_dump_json().encode())
    recipe.reporter.send(reports.Finished(step=state.step, save_s=time.monotonic() - started))


def finish_replay(recipe: Recipe, state: TrainState) -> None:
    """A replay's end: every rank gathers the adapter (fsdp: a collective); rank 0 compares it
    with the target's checkpoint and puts the ``ReplayReport`` where the agent reads it."""
    started = time.monotonic()
    ours = recipe.sharding.adapter_weights(recipe.peft_model)
    job = recipe.job
    if recipe.rank != 0 or job.verify is None:
        return
    elapsed = time.monotonic() - recipe.train_started
    report = replay_report(recipe.store, job.verify, ours, state.losses, elapsed)
    recipe.store.put_bytes(
        output_replay(job.job_id, job.attempt), report.model_dump_json().encode()
    )
    recipe.reporter.send(reports.Finished(step=state.step, save_s=time.monotonic() - started))
