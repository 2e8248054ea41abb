"""``POST /v1/fine_tuning/jobs``'s body, and the Swarm job spec it becomes.

OpenAI's hyperparameters map onto Swarm's training settings: ``batch_size`` is the batch,
``learning_rate_multiplier`` scales Swarm's default learning rate, ``n_epochs`` sets
``max_steps`` from the training file's size; a checkpoint and an evaluation come once per
epoch (and at the end), as OpenAI's do. ``"auto"`` resolves to 8 (at most the number of
examples), 1.0 and 3. ``method: {type: "dpo", dpo: {hyperparameters}}`` is a Swarm DPO job
(``JobSpec.method``), its ``beta`` (``"auto"``: 0.1) the method's. Without a validation
file nothing is held out (OpenAI trains on the whole file). ``swarm`` (an extension,
``extra_body`` in the stock client) overrides any setting of the Swarm spec's ``lora``,
``training``, ``resources`` and ``priority``.
"""

from __future__ import annotations

import math
import random
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from swarm_contracts.jobs import JobSpec
from swarm_contracts.methods import DpoMethod
from swarm_contracts.names import NAME_MAX
from swarm_gateway.fine_tune_records import Hyperparameters
from swarm_gateway.fine_tuning_view import BASE_LR
from swarm_gateway.openai_errors import OpenAIError

AUTO_BATCH_SIZE, AUTO_EPOCHS, AUTO_LR_MULTIPLIER = 8, 3, 1.0
MAX_EPOCHS, MAX_BATCH_SIZE, MAX_LR_MULTIPLIER = 50, 4096, 100.0
AUTO_BETA: float = DpoMethod.model_fields["beta"].default
MAX_BETA = 100.0
Method = Literal["supervised", "dpo"]
SWARM_SECTIONS = ("lora", "training", "resources", "priority")
METADATA_KEYS, METADATA_KEY_LEN, METADATA_VALUE_LEN = 16, 64, 512


class SupervisedIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hyperparameters: dict[str, Any] | None = None


class DpoIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hyperparameters: dict[str, Any] | None = None


class MethodIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: str
    supervised: SupervisedIn | None = None
    dpo: DpoIn | None = None
    reinforcement: dict[str, Any] | None = None


class FineTuningJobCreate(BaseModel):
    """OpenAI's ``JobCreateParams``; a field it does not have is a 400 naming it."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=200)
    training_file: str = Field(min_length=1, max_length=200)
    validation_file: str | None = Field(default=None, max_length=200)
    suffix: str | None = Field(default=None, max_length=64)
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)
    metadata: dict[str, str] | None = None
    hyperparameters: dict[str, Any] | None = None
    method: MethodIn | None = None
    integrations: list[Any] | None = None
    swarm: dict[str, Any] | None = Field(
        default=None,
        description="Swarm's extension: overrides of the job spec's lora, training, resources "
        "and priority",
    )


def _bad(param: str, message: str, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > METADATA_KEYS:
        raise _bad("metadata", f"metadata takes at most {METADATA_KEYS} keys")
    for key, value in metadata.items():
        if not key or len(key) > METADATA_KEY_LEN or len(value) > METADATA_VALUE_LEN:
            raise _bad(
                f"metadata.{key}",
                f"metadata keys are 1 to {METADATA_KEY_LEN} characters, values at most "
                f"{METADATA_VALUE_LEN}",
            )


def requested_method(body: FineTuningJobCreate) -> tuple[Method, dict[str, Any], str]:
    """The method (``supervised`` or ``dpo``), the hyperparameters asked for, and the
    parameter path they came under. Reinforcement fine-tuning is refused."""
    method = body.method
    asked = method.type if method is not None else "supervised"
    if asked == "reinforcement":
        raise _bad(
            "method.type",
            "method 'reinforcement' is not supported by Swarm; use 'supervised' or 'dpo'",
            "unsupported_method",
        )
    if asked not in ("supervised", "dpo"):
        raise _bad("method.type", f"unknown method {asked!r}: 'supervised' or 'dpo'")
    kind: Method = "dpo" if asked == "dpo" else "supervised"
    other = "dpo" if kind == "supervised" else "supervised"
    if method is not None and getattr(method, other) is not None:
        raise _bad(f"method.{other}", f"method.{other} given for a {kind} job")
    section = getattr(method, kind) if method is not None else None
    nested = section.hyperparameters if section is not None else None
    if nested is not None and body.hyperparameters is not None:
        raise _bad(
            "hyperparameters",
            f"give the hyperparameters in method.{kind}.hyperparameters or at the top level "
            "(deprecated), not both",
        )
    if nested is not None:
        return kind, nested, f"method.{kind}.hyperparameters"
    return kind, body.hyperparameters or {}, "hyperparameters"


def _number(
    raw: dict[str, Any], name: str, where: str, kind: type, low: float, high: float, auto: Any
) -> Any:
    value = raw.get(name, "auto")
    if value is None or value == "auto":
        return auto
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        ok = ok and float(value).is_integer()
    if not ok or not (low <= value <= high) or (kind is float and value <= 0):
        bound = f"> 0 and <= {high:g}" if kind is float else f"from {low:g} to {high:g}"
        raise _bad(f"{where}.{name}", f"{name} must be 'auto' or a number {bound}; got {value!r}")
    return kind(value)


def resolve_beta(raw: dict[str, Any], where: str) -> float:
    """A DPO job's beta: ``"auto"`` is Swarm's default."""
    return float(_number(raw, "beta", where, float, 0, MAX_BETA, AUTO_BETA))


def resolve_hyperparameters(
    raw: dict[str, Any], where: str, examples: int, method: Method = "supervised"
) -> Hyperparameters:
    known = {"n_epochs", "batch_size", "learning_rate_multiplier"}
    if method == "dpo":
        known.add("beta")
    unknown = sorted(set(raw) - known)
    if unknown:
        raise _bad(f"{where}.{unknown[0]}", f"unknown hyperparameter {unknown[0]!r}")
    return Hyperparameters(
        n_epochs=_number(raw, "n_epochs", where, int, 1, MAX_EPOCHS, AUTO_EPOCHS),
        batch_size=_number(
            raw, "batch_size", where, int, 1, MAX_BATCH_SIZE, min(AUTO_BATCH_SIZE, examples)
        ),
        learning_rate_multiplier=_number(
            raw, "learning_rate_multiplier", where, float, 0, MAX_LR_MULTIPLIER, AUTO_LR_MULTIPLIER
        ),
    )


def adapter_name(suffix: str | None, job_id: str) -> str:
    """The registry name of the adapter the job trains: the suffix, made a Swarm name (jobs
    with the same suffix are versions of one adapter), else ``ft-<job hex>``."""
    if suffix is None:
        return "ft-" + job_id.removeprefix("job-")
    name = re.sub(r"[^a-z0-9_-]+", "-", suffix.lower()).strip("-_")[:NAME_MAX]
    if not name:
        raise _bad("suffix", f"suffix {suffix!r} has no letter or digit to name a model by")
    return name


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def build_spec(
    body: FineTuningJobCreate,
    *,
    job_id: str,
    base_model: str,
    from_adapter: str | None,
    dataset: str,
    validation: str | None,
    examples: int,
    hyper: Hyperparameters,
    beta: float | None = None,
) -> tuple[JobSpec, Hyperparameters, int]:
    """The Swarm spec, the hyperparameters to report (from the spec when ``swarm`` changed
    the training settings), and the seed. ``beta``: a DPO job's."""
    seed = body.seed if body.seed is not None else random.randrange(2**31)
    per_epoch = math.ceil(examples / hyper.batch_size)
    max_steps = per_epoch * hyper.n_epochs
    training: dict[str, Any] = {
        "max_steps": max_steps,
        "batch_size": hyper.batch_size,
        "lr": BASE_LR * hyper.learning_rate_multiplier,
        "seed": seed,
        "eval_every": per_epoch,
        "checkpoint_every": per_epoch,
        "warmup_steps": min(10, max_steps // 10),
    }
    if validation is None:
        training["val_fraction"] = 0.0
    raw: dict[str, Any] = {
        "name": adapter_name(body.suffix, job_id),
        "base_model": base_model,
        "dataset": dataset,
        "validation": validation,
        "from_adapter": from_adapter,
        "training": training,
    }
    if beta is not None:
        raw["method"] = {"type": "dpo", "beta": beta}
    overrides = body.swarm or {}
    for key in overrides:
        if key not in SWARM_SECTIONS:
            raise _bad(
                f"swarm.{key}",
                f"swarm.{key}: only {', '.join(SWARM_SECTIONS)} can be set this way",
            )
    raw = _merge(raw, overrides)
    try:
        spec = JobSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        param = f"swarm.{loc}" if loc.split(".")[0] in SWARM_SECTIONS else loc
        raise _bad(param, f"{param}: {first['msg']}") from exc
    if "training" in overrides:
        t = spec.training
        hyper = Hyperparameters(
            n_epochs=max(1, round(t.max_steps * t.batch_size * t.grad_accum / examples)),
            batch_size=t.batch_size * t.grad_accum,
            learning_rate_multiplier=t.lr / BASE_LR,
        )
    return spec, hyper, spec.training.seed
