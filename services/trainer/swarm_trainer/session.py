"""A Tinker training session on this worker: one LoRA model and its AdamW optimizer, driven
call by call (swarm_contracts.sessions) instead of by a training loop.

The model lives in the agent's process, on the session lane's GPU if it has GPUs (its base in
bf16 there, the LoRA weights fp32 under bf16 autocast, as a job trains; fp32 throughout on a
CPU); the
calls of a session run one at a time in a worker thread, so the agent keeps heartbeating while
they compute. A call's data go through the model in micro-batches (``micro_batches``: rows
padded at their end to the micro-batch's longest datum, ``CPU_TOKENS_PER_FORWARD`` or
``GPU_TOKENS_PER_FORWARD`` tokens a pass), one forward and one backward each, rather than one
datum at a time. The losses are Tinker's (sums over tokens, not means: the client's weights
normalise):

* ``cross_entropy``: ``-(logprobs * weights)``;
* ``importance_sampling``: ``-(exp(logprobs - sampling_logprobs) * advantages)``;
* ``ppo``: the clipped surrogate, the ratio clipped to
  ``[clip_low_threshold, clip_high_threshold]`` (``loss_fn_config``, default 0.8 and 1.2);
* ``cispo``: ``-(sg(clip(ratio)) * logprobs * advantages)``, the ratio clipped to
  ``[clip_low_threshold, clip_high_threshold]`` (default 0.0 and 4.0: an upper cap only);
* ``dro``: ``-(logprobs * advantages - beta / 2 * (logprobs - sampling_logprobs) ** 2)``
  (``beta`` in ``loss_fn_config``, required).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from swarm_contracts.sessions import LOSSES, AdamStep, CreateSession, SessionDatum, SessionResult
from swarm_runtime.rpc import Refused
from swarm_runtime.store import ObjectStore, sha256_file
from swarm_trainer.checkpoint import ADAPTER_FILE, load_optimizer, save_adapter, save_optimizer
from swarm_trainer.compute import use_bf16
from swarm_trainer.model import compute_lora_in_autocast
from swarm_trainer.step import autocast

# What each loss needs besides the input tokens (Tinker's names).
LOSS_INPUTS = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": ("target_tokens", "logprobs", "advantages"),
    "ppo": ("target_tokens", "logprobs", "advantages"),
    "cispo": ("target_tokens", "logprobs", "advantages"),
    "dro": ("target_tokens", "logprobs", "advantages"),
}
STATE_FILE = "session.json"
# Tokens (padding included) per forward pass: a batch of RL samples runs as a few batched
# passes instead of one per sample, while the logits (tokens x vocabulary) stay bounded. On a
# CPU, passes past about a thousand tokens gain nothing and lose cache (bench/session_forward.py,
# docs/performance.md); a GPU wants them as large as memory allows (not measured).
CPU_TOKENS_PER_FORWARD = 1024
GPU_TOKENS_PER_FORWARD = 8192


def micro_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Consecutive datums (their indices) grouped so that each group, padded to its longest,
    stays within ``budget`` tokens (a datum longer than that is a group of its own)."""
    groups: list[list[int]] = []
    longest = 0
    for i, n in enumerate(lengths):
        if groups and max(longest, n) * (len(groups[-1]) + 1) <= budget:
            groups[-1].append(i)
            longest = max(longest, n)
        else:
            groups.append([i])
            longest = n
    return groups


class TrainingSession:
    def __init__(self, spec: CreateSession, model_dir: Path, device: str | None = None) -> None:
        """``device``: where the model lives (the worker's session lane: its GPU, held in Ray,
        swarm_trainer.session_lane); by default the first GPU there is, else the CPU."""
        self.spec = spec
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.bf16 = use_bf16("auto", self.device)
        base = AutoModelForCausalLM.from_pretrained(
            model_dir,
            use_safetensors=True,
            dtype=torch.bfloat16 if self.bf16 else torch.float32,
            attn_implementation="sdpa",
        )
        self.vocab_size = int(base.config.vocab_size)
        self.max_context = int(getattr(base.config, "max_position_embeddings", 2048))
        targets = spec.target_modules
        if not targets:
            raise Refused("lora_config: train_attn and train_mlp are both off: nothing to train")
        if spec.seed is not None:
            torch.manual_seed(spec.seed)
        config = LoraConfig(
            r=spec.rank, lora_alpha=spec.rank, lora_dropout=0.0, target_modules=targets
        )
        # autocast_adapter_dtype (peft's default): fp32 LoRA weights on a bf16 base.
        self.model: PeftModel = get_peft_model(base, config).to(self.device)
        if self.bf16:
            compute_lora_in_autocast(self.model)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-4)
        self.step = 0
        self.has_grads = False

    # --- calls ---------------------------------------------------------------------------

    def forward(
        self,
        data: list[SessionDatum],
        loss_fn: str,
        config: dict[str, float],
        *,
        backward: bool,
    ) -> SessionResult:
        if loss_fn not in LOSSES:
            raise Refused(f"loss_fn: {loss_fn!r} is not served; served: {', '.join(LOSSES)}")
        if not data:
            raise Refused("data: no datum")
        self._check(data, loss_fn)
        self.model.train(backward)
        outputs: list[dict[str, list[float]]] = []
        total = 0.0
        cuda = self.device.type == "cuda"
        budget = GPU_TOKENS_PER_FORWARD if cuda else CPU_TOKENS_PER_FORWARD
        for group in micro_batches([len(d.tokens) for d in data], budget):
            batch = [data[i] for i in group]
            with torch.set_grad_enabled(backward):
                losses = []
                for datum, logprobs in zip(batch, self._logprobs(batch), strict=True):
                    elementwise = self._loss(loss_fn, datum, logprobs, config)
                    losses.append(elementwise.sum())
                    outputs.append(
                        {
                            "logprobs": logprobs.detach().cpu().tolist(),
                            "elementwise_loss": elementwise.detach().cpu().tolist(),
                        }
                    )
                loss = torch.stack(losses).sum()
                if backward:  # gradients add up over the micro-batches
                    loss.backward()
                    self.has_grads = True
            total += float(loss.detach())
        return SessionResult(outputs=outputs, metrics={"loss:sum": total}, step=self.step)

    def _logprobs(self, batch: list[SessionDatum]) -> list[torch.Tensor]:
        """Each datum's log-probability of its target tokens, from one padded forward pass."""
        lengths = [len(d.tokens) for d in batch]
        ids = torch.zeros((len(batch), max(lengths)), dtype=torch.long)
        for row, datum in enumerate(batch):
            ids[row, : lengths[row]] = torch.tensor(datum.tokens)
        # No attention mask: the padding is at the end of each row, and causal attention never
        # looks ahead, so a datum's positions see only its own tokens (and sdpa keeps its
        # causal fast path, which an explicit mask would cost).
        with autocast(self.bf16):
            logits = self.model(input_ids=ids.to(self.device)).logits
        out = []
        for row, datum in enumerate(batch):
            rows = logits[row, : lengths[row]].float()
            targets = self._input(datum, "target_tokens").long()
            # log_softmax's value at the target only: no second tokens x vocabulary tensor.
            picked = rows.gather(1, targets[:, None])[:, 0]
            out.append(picked - torch.logsumexp(rows, dim=-1))
        return out

    def optim_step(self, adam: AdamStep) -> SessionResult:
        if not self.has_grads:
            raise Refused("optim_step: no forward_backward since the last step: no gradient")
        for group in self.optimizer.param_groups:
            group.update(
                lr=adam.learning_rate,
                betas=(adam.beta1, adam.beta2),
                eps=adam.eps,
                weight_decay=adam.weight_decay,
            )
        metrics: dict[str, float] = {}
        if adam.grad_clip_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.params, adam.grad_clip_norm)
            metrics["grad_norm"] = float(norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.has_grads = False
        self.step += 1
        return SessionResult(metrics=metrics, step=self.step)

    def save(self, store: ObjectStore, key: str, *, optimizer: bool) -> SessionResult:
        """The adapter in PEFT's layout (servable as it is), with the optimizer's state and the
        step when ``optimizer``: safetensors and JSON only."""
        with tempfile.TemporaryDirectory() as tmp:
            directory = Path(tmp)
            save_adapter(self.model, directory)
            if optimizer:
                save_optimizer(self.optimizer.state_dict(), directory)
                (directory / STATE_FILE).write_text(json.dumps({"step": self.step}))
            files = {p.name: sha256_file(p) for p in directory.iterdir()}
            store.upload_dir(directory, key)
        return SessionResult(store_key=key, files=files, step=self.step)

    def load(self, store: ObjectStore, key: str, *, optimizer: bool) -> SessionResult:
        with tempfile.TemporaryDirectory() as tmp:
            directory = Path(tmp)
            store.download_dir(key, directory)
            if not (directory / ADAPTER_FILE).exists():
                raise Refused(f"path: no saved weights at {key}", "not_found")
            if optimizer and not (directory / STATE_FILE).exists():
                raise Refused("path: these weights were saved without the optimizer's state")
            weights = load_file(directory / ADAPTER_FILE, device=str(self.device))
            result = set_peft_model_state_dict(self.model, weights)
            if result.unexpected_keys:
                raise Refused(f"path: the saved adapter does not fit this model ({key})")
            if optimizer:
                self.optimizer.load_state_dict(load_optimizer(directory))
                self.step = int(json.loads((directory / STATE_FILE).read_text())["step"])
        self.optimizer.zero_grad(set_to_none=True)
        self.has_grads = False
        return SessionResult(store_key=key, step=self.step)

    def info(self) -> SessionResult:
        return SessionResult(
            step=self.step,
            model_info={"vocab_size": self.vocab_size, "max_context": self.max_context},
        )

    # --- checks and losses ------------------------------------------------------------------

    def _check(self, data: list[SessionDatum], loss_fn: str) -> None:
        for i, datum in enumerate(data):
            n = len(datum.tokens)
            if n > self.max_context:
                raise Refused(
                    f"data[{i}]: {n} tokens exceed the model's context of {self.max_context}"
                )
            if min(datum.tokens) < 0 or max(datum.tokens) >= self.vocab_size:
                raise Refused(f"data[{i}]: a token is outside the vocabulary ({self.vocab_size})")
            for name in LOSS_INPUTS[loss_fn]:
                values = datum.inputs.get(name)
                if values is None:
                    raise Refused(f"data[{i}].loss_fn_inputs: {loss_fn} needs {name!r}")
                if len(values) != n:
                    raise Refused(
                        f"data[{i}].loss_fn_inputs.{name}: {len(values)} values for {n} tokens"
                    )
            targets = datum.inputs["target_tokens"]
            if min(targets) < 0 or max(targets) >= self.vocab_size:
                raise Refused(f"data[{i}].loss_fn_inputs.target_tokens: outside the vocabulary")

    def _input(self, datum: SessionDatum, name: str) -> torch.Tensor:
        return torch.tensor(datum.inputs[name], device=self.device, dtype=torch.float32)

    def _loss(
        self, loss_fn: str, datum: SessionDatum, logprobs: torch.Tensor, config: dict[str, float]
    ) -> torch.Tensor:
        if loss_fn == "cross_entropy":
            return -logprobs * self._input(datum, "weights")
        advantages = self._input(datum, "advantages")
        sampled = self._input(datum, "logprobs")
        if loss_fn == "dro":
            if "beta" not in config:
                raise Refused("loss_fn_config.beta: dro needs it")
            return -(logprobs * advantages - 0.5 * config["beta"] * (logprobs - sampled) ** 2)
        ratio = torch.exp(logprobs - sampled)
        if loss_fn == "importance_sampling":
            return -ratio * advantages
        if loss_fn == "cispo":
            # The clipped ratio is a coefficient: no gradient flows through it.
            low = config.get("clip_low_threshold", 0.0)
            high = config.get("clip_high_threshold", 4.0)
            return -torch.clamp(ratio, low, high).detach() * logprobs * advantages
        low = config.get("clip_low_threshold", 0.8)
        high = config.get("clip_high_threshold", 1.2)
        clipped = torch.clamp(ratio, low, high)
        return -torch.minimum(ratio * advantages, clipped * advantages)
