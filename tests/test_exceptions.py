"""Every exception Swarm defines survives pickling as itself.

An error raised in a Ray worker reaches the driver pickled; one that cannot be unpickled hides
the real error behind ``TypeError: __init__() missing ... argument`` (issue 21: ``Unavailable``
did). The classes are found by importing every module of every package, so a new exception is
checked without anyone remembering to list it.
"""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
from typing import Any

import pytest

PACKAGES = (
    "swarm_contracts",
    "swarm_runtime",
    "swarm_generation",
    "swarm_scheduler",
    "swarm_registry",
    "swarm_telemetry",
    "swarm_gateway",
    "swarm_trainer",
    "swarm_sweeps",
    "swarm_inference",
    "swarm",
)

# Constructor arguments of the exceptions whose constructor is not ``cls(message)``.
EXAMPLES: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    "swarm_runtime.rpc.Refused": (("no such job", "not_found"), {}),
    "swarm_registry.errors.RegistryError": (("outside the scope", "forbidden"), {}),
    "swarm_runtime.rpc.Unavailable": (("registry", "no answer within 5s"), {}),
    "swarm_runtime.intake.RetryLater": ((0.5,), {}),
    "swarm_trainer.signed_store.StoreAccessRefused": (("not this worker's", "forbidden"), {}),
    "swarm_inference.worker.RequestFailed": (("overloaded", "too many requests", 429), {}),
    "swarm_gateway.openai_errors.OpenAIError": ((400, "bad model"), {"param": "model"}),
    "swarm_gateway.dataset_validation.DatasetError": (("not JSON", 3), {}),
    "swarm.errors.SwarmError": (("refused", 409), {"detail": {"why": "busy"}}),
}


def swarm_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for root in PACKAGES:
        package = importlib.import_module(root)
        for info in pkgutil.walk_packages(package.__path__, f"{root}."):
            if info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            for obj in vars(module).values():
                if (
                    inspect.isclass(obj)
                    and issubclass(obj, BaseException)
                    and obj.__module__ == module.__name__
                ):
                    found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


EXCEPTIONS = swarm_exceptions()


def example(name: str, cls: type[BaseException]) -> BaseException:
    """An instance of ``cls``: from EXAMPLES, else (a subclass's) its base's example, else
    ``cls(message)``."""
    for base in cls.__mro__:
        key = f"{base.__module__}.{base.__qualname__}"
        if key in EXAMPLES:
            args, kwargs = EXAMPLES[key]
            return cls(*args, **kwargs)
    return cls("something went wrong")


def test_the_packages_define_exceptions() -> None:
    # The discovery itself works (a broken walk would make every test below vacuous).
    assert {"swarm_runtime.rpc.Unavailable", "swarm_runtime.rpc.Refused"} <= set(EXCEPTIONS)
    assert len(EXCEPTIONS) > 20


@pytest.mark.parametrize("name", sorted(EXCEPTIONS))
def test_an_exception_round_trips_through_pickle(name: str) -> None:
    original = example(name, EXCEPTIONS[name])
    copy = pickle.loads(pickle.dumps(original))
    assert type(copy) is type(original)
    assert str(copy) == str(original)
    assert copy.args == original.args
    assert vars(copy) == vars(original)
