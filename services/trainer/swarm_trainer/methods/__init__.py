"""Training methods, one module each: ``sft`` (supervised fine-tuning) and ``dpo`` (Direct
Preference Optimization). ``method.Method`` is what the recipe asks of one; ``for_job``
makes the one a job's spec names (``JobSpec.method``)."""

from __future__ import annotations

from peft import PeftModel

from swarm_contracts.methods import DpoMethod, SftMethod
from swarm_trainer.methods.dpo import Dpo, Reference
from swarm_trainer.methods.method import Evaluated, Method
from swarm_trainer.methods.sft import Sft

__all__ = ["Dpo", "Evaluated", "Method", "Sft", "for_job"]


def for_job(spec: SftMethod | DpoMethod, model: PeftModel, from_parent: bool) -> Method:
    """The method of a job whose training model (unwrapped) is ``model``; ``from_parent``:
    the job continues a parent adapter, loaded into ``model`` and not yet trained."""
    if isinstance(spec, DpoMethod):
        return Dpo(spec.beta, Reference.of(model, from_parent))
    return Sft()
