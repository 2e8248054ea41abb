"""What the agent hands to every rank of a run: the assignment and how to reach the store, the
channels to the agent, where to work and cache, and where to resume from.

Ray Train passes it to ``recipe.train_loop`` as ``train_loop_config``, which Ray wants to be a
dict (with ``RAY_TRAIN_ENABLE_STATE_TRACKING`` it validates it as one, and records a string
form of each value for its dashboard): so the dict holds the one typed object under
``LOOP_CONFIG_KEY``. Ray pickles it to the workers as it is; the store secret (or, for a
worker without store keys, the attempt token) is a ``SecretStr``, so Ray's records show it
masked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from ray.train import Checkpoint

from swarm_contracts.workers import Assignment
from swarm_runtime.settings import Settings
from swarm_runtime.store import ObjectStore, open_store
from swarm_trainer.cache import CacheSettings
from swarm_trainer.hooks import LoopHooks
from swarm_trainer.signed_store import SignedAccess, SignedStore

LOOP_CONFIG_KEY = "loop"


class StoreConnection(BaseModel):
    """The store settings a worker needs (the agent's other settings stay with the agent)."""

    model_config = ConfigDict(frozen=True)

    url: str
    access_key: str | None = None
    secret_key: SecretStr | None = None
    region: str | None = None
    # A store without keys (SWARM_STORE_ACCESS=signed): the attempt's grant, no secret key.
    signed: SignedAccess | None = None

    @classmethod
    def of(cls, settings: Settings, store: ObjectStore | None = None) -> StoreConnection:
        """How the ranks reach ``store`` (the agent's store for the job)."""
        if isinstance(store, SignedStore):
            return cls(url=store.url, signed=store.access)
        return cls(
            url=settings.store_url,
            access_key=settings.s3_access_key,
            secret_key=settings.s3_secret_key,
            region=settings.s3_region,
        )

    def open(self) -> ObjectStore:
        if self.signed is not None:
            return SignedStore(self.signed)
        return open_store(
            Settings(
                store_url=self.url,
                s3_access_key=self.access_key,
                s3_secret_key=self.secret_key,
                s3_region=self.region,
            )
        )


class LoopConfig(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    assignment: Assignment
    store: StoreConnection
    work_dir: Path  # each rank makes its own temporary directory in it
    cache: CacheSettings  # the machine's cache of base models and datasets
    # A committed checkpoint of an earlier attempt (see ``resume_point.prepare_resume``); a
    # retry within this run resumes from the run's own latest checkpoint instead.
    resume_from: Checkpoint | None = None
    # Rank 0's reports to the agent, and the cancel flag (``control.JobControl``).
    control: Any = None
    hooks: LoopHooks = Field(default_factory=LoopHooks)  # tests only

    def for_ray(self) -> dict[str, LoopConfig]:
        """As ``AttemptTrainer(train_loop_config=...)`` takes it."""
        return {LOOP_CONFIG_KEY: self}

    @classmethod
    def from_ray(cls, config: dict[str, Any]) -> LoopConfig:
        loop = config[LOOP_CONFIG_KEY]
        if not isinstance(loop, cls):
            raise TypeError(f"train_loop_config[{LOOP_CONFIG_KEY!r}] is {type(loop).__name__}")
        return loop
