"""How a job trains: the training method of a job spec (``JobSpec.method``).

``sft`` (the default): next-token loss on the completions (or every token of plain text).
``dpo``: Direct Preference Optimization (Rafailov et al., 2023) on preference pairs: the
sigmoid loss ``-log sigmoid(beta * ((log pi(chosen) - log ref(chosen)) - (log pi(rejected)
- log ref(rejected))))``, the reference ``ref`` being the base model (the adapter disabled)
or, for a job continuing an adapter (``from_adapter``), that parent adapter.

Each method takes its own dataset formats (``swarm_contracts.datasets``): a DPO job needs
preference pairs, an SFT job anything else.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class SftMethod(_Strict):
    type: Literal["sft"] = "sft"


class DpoMethod(_Strict):
    type: Literal["dpo"]
    # How far the policy may move from the reference: a larger beta keeps it closer.
    beta: float = Field(default=0.1, gt=0, le=100)


TrainingMethod = Annotated[SftMethod | DpoMethod, Field(discriminator="type")]
METHOD_TYPES = ("sft", "dpo")


class PreferenceMetrics(BaseModel):
    """DPO's measures over the preference pairs of a step (rank 0's) or of an evaluation
    (every rank's). A reward is ``β · (log π(y|x) - log π_ref(y|x))``."""

    reward_accuracy: float = Field(description="share of pairs whose chosen reward is higher")
    chosen_reward: float = Field(description="mean reward of the chosen answers")
    rejected_reward: float = Field(description="mean reward of the rejected answers")
    margin: float = Field(description="mean of chosen minus rejected reward")

    @classmethod
    def of(cls, metrics: dict[str, float]) -> PreferenceMetrics | None:
        """From a method's measures: None for a method that has none of these (SFT)."""
        names = cls.model_fields.keys()
        if not all(name in metrics for name in names):
            return None
        return cls(**{name: metrics[name] for name in names})
