"""Checks of a job spec against what the tenant has (datasets, adapters), made up front so
that a bad ``POST /v1/jobs`` or ``POST /v1/sweeps`` is a 422 naming the field rather than a
job that fails later."""

from __future__ import annotations

from collections.abc import Sequence

from swarm_contracts.datasets import DatasetInfo, method_takes
from swarm_contracts.evals import EvalSpec
from swarm_contracts.jobs import JobSpec
from swarm_contracts.refs import Ref
from swarm_contracts.registry import (
    AdapterVersion,
    ForkCheckpoint,
    ForkSource,
    GetAdapter,
    GetModel,
)
from swarm_contracts.registry_api import FORK_CHECKPOINT, GET_ADAPTER, GET_MODEL
from swarm_gateway.errors import field_error
from swarm_gateway.state import Gateway
from swarm_runtime.rpc import Refused, Unavailable


async def check_datasets(
    gw: Gateway, tenant: str, spec: JobSpec, loc: tuple[str, ...] = ("body",)
) -> None:
    """Refuse a spec whose dataset, validation set or eval set the tenant has not uploaded,
    and one whose task evals would have no row to grade."""
    found: dict[str, DatasetInfo] = {}
    evals = spec.evals
    for path, dataset_id in (
        (("dataset",), spec.dataset),
        (("validation",), spec.validation),
        (("evals", "dataset"), evals.dataset if evals else None),
    ):
        if not dataset_id:
            continue
        entry = await gw.datasets.get(f"{tenant}.{dataset_id}")
        if entry is None:
            raise field_error(
                422,
                [*loc, *path],
                f"dataset {dataset_id} not found for tenant {tenant}: upload it via /v1/datasets",
                "not_found",
            )
        found[path[0]] = entry[0]
        if path[0] != "evals":
            check_method_format(spec, entry[0], [*loc, *path])
    if evals is not None:
        check_eval_schemas(evals, loc)
        check_eval_set(spec, evals, found, loc)


def check_method_format(spec: JobSpec, dataset: DatasetInfo, loc: Sequence[str | int]) -> None:
    """A DPO job trains on preference pairs, an SFT job on anything else."""
    method = spec.method.type
    if method_takes(method, dataset.format):
        return
    if method == "dpo":
        need = (
            "a DPO job needs preference pairs: {'prompt','chosen','rejected'} (strings or chat "
            "messages) or {'input':{'messages'},'preferred_output','non_preferred_output'}"
        )
    else:
        need = "preference pairs train with method {'type': 'dpo'}"
    raise field_error(
        422, list(loc), f"dataset {dataset.id} holds {dataset.format} examples: {need}", "invalid"
    )


def check_eval_schemas(evals: EvalSpec, loc: tuple[str, ...]) -> None:
    """Refuse a ``json_valid`` grader whose JSON Schema does not compile."""
    import jsonschema

    for i, grader in enumerate(evals.graders):
        schema = getattr(grader, "json_schema", None)
        if schema is None:
            continue
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise field_error(
                422,
                [*loc, "evals", "graders", i, "schema"],
                f"schema is not a valid JSON Schema: {exc.message}",
                "invalid",
            ) from exc


def check_eval_set(
    spec: JobSpec, evals: EvalSpec, found: dict[str, DatasetInfo], loc: tuple[str, ...]
) -> None:
    """The eval set the trainer will take (``EvalSpec``'s rule) must have rows with an answer
    to grade: prompt/completion or chat rows, at least one of them."""
    if "evals" in found:
        source, where = found["evals"], ["evals", "dataset"]
        rows = source.examples
    elif evals.fraction is None and "validation" in found:
        source, where = found["validation"], ["validation"]
        rows = source.examples
    else:
        source = found["dataset"]
        fraction = evals.fraction if evals.fraction is not None else spec.training.val_fraction
        where = (
            ["evals", "fraction"] if evals.fraction is not None else ["training", "val_fraction"]
        )
        # As ``split_holdout`` draws it: at least one row of two or more, if the fraction is > 0.
        rows = (
            min(source.examples - 1, max(1, round(source.examples * fraction)))
            if (fraction > 0 and source.examples >= 2)
            else 0
        )
    if rows < 1:
        raise field_error(
            422,
            [*loc, *where],
            "the task evals' held-out set would have no rows: give evals.dataset, "
            "evals.fraction, a validation set, or a training.val_fraction above 0",
        )
    if source.format == "text":
        raise field_error(
            422,
            [*loc, *where],
            f"dataset {source.id} holds plain text rows: task evals need prompt/completion or "
            "chat rows, whose answers they grade",
        )


async def check_parent(
    gw: Gateway, tenant: str, spec: JobSpec, loc: tuple[str, ...] = ("body",)
) -> AdapterVersion | None:
    """Refuse at once a ``from_adapter`` that is unknown, another tenant's, or trained on
    another base model; the parent version when there is one. The scheduler checks again when
    it pins the versions (which also covers jobs submitted over NATS, and a base model named
    without a version)."""
    if spec.from_adapter is None:
        return None
    request = GetAdapter(name=spec.from_adapter, tenant=tenant)
    try:
        parent = await gw.registry.call(GET_ADAPTER, request)
    except Refused as exc:
        if exc.code != "not_found":
            raise
        raise field_error(
            422,
            [*loc, "from_adapter"],
            f"adapter {spec.from_adapter} not found for tenant {tenant}",
            "not_found",
        ) from exc
    base = Ref.parse_versioned(spec.base_model)
    mismatch = parent.lineage.base_model_mismatch(base.name, base.version)
    if mismatch is not None:
        raise field_error(
            422,
            [*loc, "from_adapter"],
            f"adapter {spec.from_adapter} was {mismatch}, not on {spec.base_model}",
        )
    return parent


# The registry's refusal of a ``from_checkpoint``, as the status that names the field: an
# unknown job (or another tenant's) is not found; a step with no committed checkpoint
# conflicts with what the job has (never made there, or pruned or collected since).
_FORK_STATUS = {"not_found": 404, "conflict": 409, "invalid": 422}


async def check_fork(
    gw: Gateway,
    tenant: str,
    spec: JobSpec,
    job_id: str | None = None,
    loc: tuple[str, ...] = ("body",),
) -> ForkSource | None:
    """Refuse at once a ``from_checkpoint`` naming an unknown job or another tenant's (404), a
    step of it with no committed checkpoint (409), or a checkpoint trained on another base
    model (422); the source when there is one (its LoRA shape is the job's). The registry
    answers a dry run of the pinning the scheduler asks for; with the registry away the job is
    accepted, and the scheduler's pinning fails it with the reason."""
    if spec.from_checkpoint is None:
        return None
    request = ForkCheckpoint(
        job_id=job_id,
        tenant=tenant,
        source=spec.from_checkpoint,
        optimizer=spec.from_checkpoint_optimizer,
        dry_run=True,
    )
    try:
        found = await gw.registry.call(FORK_CHECKPOINT, request)
    except Unavailable:
        return None
    except Refused as exc:
        status = _FORK_STATUS.get(exc.code)
        if status is None:
            raise
        raise field_error(status, [*loc, "from_checkpoint"], exc.message, exc.code) from exc
    base = Ref.parse_versioned(spec.base_model)
    source = found.base_model
    if source.name != base.name or base.version not in (None, source.version):
        raise field_error(
            422,
            [*loc, "from_checkpoint"],
            f"checkpoint {spec.from_checkpoint} was trained on {source.name}@{source.version}, "
            f"not on {spec.base_model}",
        )
    return found


async def check_base_model(gw: Gateway, spec: JobSpec, loc: tuple[str, ...] = ("body",)) -> None:
    """Refuse at once a base model the registry does not know, and a LoRA ``target_modules``
    entry that names no module of it (when the registry knows its modules). With the registry
    away the job is accepted: the scheduler checks the model again when it pins the version,
    and a job it cannot place fails with the reason."""
    ref = Ref.parse_versioned(spec.base_model)
    try:
        model = await gw.registry.call(GET_MODEL, GetModel(name=ref.name, version=ref.version))
    except Unavailable:
        return
    except Refused as exc:
        if exc.code != "not_found":
            raise
        raise field_error(
            422,
            [*loc, "base_model"],
            f"unknown base model {spec.base_model}: see GET /v1/models",
            "not_found",
        ) from exc
    targets = spec.lora.target_modules
    if not model.modules or not isinstance(targets, list):
        return
    known = set(model.modules)
    for index, entry in enumerate(targets):
        # PEFT matches an entry against the end of each module's dotted name.
        if entry.rsplit(".", 1)[-1] not in known:
            raise field_error(
                422,
                [*loc, "lora", "target_modules", index],
                f"{model.name}@{model.version} has no module {entry!r}; "
                f"its modules with weights: {', '.join(model.modules)} (or 'all-linear')",
            )
