"""Where a rank's data stream is, saved beside each checkpoint and taken up on resume, so a
resumed run reads exactly the examples the lost one would have read next."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Position:
    """The next example of a rank's stream: ``offset`` into the (shuffled) training examples
    of the ``ordinal``-th frame of epoch ``epoch``'s frame order."""

    epoch: int = 0
    ordinal: int = 0
    offset: int = 0


class ResumeMismatch(ValueError):
    """A checkpoint whose data position this run cannot take up."""


def position_file(rank: int) -> str:
    return f"data_rank{rank}.json"


def save_position(
    directory: Path, rank: int, world: int, index: int, at: Position, dataset: str
) -> None:
    """``dataset``: the training set's sha256, whose stream ``at`` is a place in."""
    body = {"world": world, "data_index": index, "dataset": dataset, **asdict(at)}
    (directory / position_file(rank)).write_text(json.dumps(body))


def _other_world(saved: int, world: int) -> ResumeMismatch:
    def workers(n: int) -> str:
        return f"{n} worker{'' if n == 1 else 's'}"

    return ResumeMismatch(
        f"the checkpoint was saved by {workers(saved)} and this run has {world}: a streamed "
        "dataset is sharded by the number of workers, so a run resumes with the number it "
        "started with (resources.workers)"
    )


def load_position(
    directory: Path, rank: int, world: int, index: int, dataset: str
) -> Position | None:
    """Where this rank's stream of ``dataset`` (its sha256) was at micro-batch ``index`` when
    the checkpoint was saved; None for a checkpoint from before positions were saved, or one
    saved on another dataset (a fork with ``from_checkpoint_optimizer`` that trains on other
    data): the stream then counts its way there, as an in-memory sampler indexes its
    examples. ``ResumeMismatch`` when the checkpoint was saved by another number of ranks."""
    path = directory / position_file(rank)
    saved = sorted(directory.glob("data_rank*.json"))
    if not saved:
        return None
    if json.loads(saved[0].read_text()).get("dataset", dataset) != dataset:
        return None
    if not path.is_file():
        raise _other_world(len(saved), world)
    body = json.loads(path.read_text())
    if int(body["world"]) != world:
        raise _other_world(int(body["world"]), world)
    if int(body["data_index"]) != index:
        raise ResumeMismatch(
            f"the checkpoint's data position is for micro-batch {body['data_index']}, "
            f"its training state for {index}"
        )
    return Position(int(body["epoch"]), int(body["ordinal"]), int(body["offset"]))
