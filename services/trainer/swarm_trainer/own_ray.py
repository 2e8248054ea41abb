"""The Ray an agent starts for itself: a head node on this machine with the processes a trainer
uses, no more.

``ray.init(address="local")`` also starts the autoscaler's monitor (nothing to scale: one
machine), Ray's API server (job submission and the state API, even without the dashboard:
about 0.7 CPU-s to start, which nothing of an agent's asks) and a log monitor that tails every
Ray log file and ships each new line through the GCS to the driver (seconds of CPU a minute,
for as long as the agent runs). The monitor and the API server are never started; the log
monitor only while ``SWARM_RAY_WORKER_LOGS`` is true (the default: the ranks' output in the
agent's log too; it is in the node's own log files either way). The test suite turns it off.

``ray.init`` has no parameter for these; the node is started as Ray's own ``ray.init`` and
``ray.cluster_utils.Cluster`` start it (``ray._private.node.Node``, less its API server), and
the driver connects to it. ``tests/trainer/test_own_ray.py`` fails if a Ray upgrade changes
what this starts.
"""

from __future__ import annotations

import atexit
from typing import Any

# The node this process started (stopped by ``stop``, called at exit too), and the fork server
# its workers start from.
_node: Any = None
_warm: Any = None


def start(
    cpus: int, *, worker_logs: bool, warm_start: bool = True, gpus: int | None = None
) -> None:
    """Start a Ray node of ``cpus`` CPUs (and ``gpus`` GPUs, else those Ray finds) and connect
    to it; its worker processes forked from a server that imported what they need
    (``warm_start``) unless told not to."""
    global _node, _warm
    import ray
    from ray._private.node import Node
    from ray._private.parameter import RayParams

    class AgentNode(Node):
        def start_api_server(
            self, *, include_dashboard: bool | None, raise_on_failure: bool
        ) -> None:
            pass

    warm = None
    if warm_start:
        from swarm_trainer import warm_start as warm_server

        warm = warm_server.start()
    params = RayParams(
        num_cpus=cpus,
        num_gpus=gpus,
        include_dashboard=False,
        include_log_monitor=worker_logs,
        no_monitor=True,
        # Ray starts a worker process per CPU when the first driver connects, for tasks to come;
        # an agent's come as actors (the job control, the runs' controllers and ranks), most of
        # which need a worker of their own runtime environment: the spare ones sat idle.
        _system_config={"prestart_worker_first_driver": False},
        # Ray's own imports Ray in every worker's process before the worker's Python starts.
        setup_worker_path=warm.setup_worker_path() if warm else None,
    )
    # As ray.init starts it: Ray's reaper ends the node's processes with this one, however it
    # ends. Not Ray's exit hooks (shutdown_at_exit): they take SIGTERM over, which the agent
    # handles itself (a graceful hand-back), and only work from the main thread.
    _node = AgentNode(params, head=True, shutdown_at_exit=False, spawn_reaper=True)
    atexit.register(stop)
    _warm = warm
    runtime_env = {"py_executable": warm.py_executable()} if warm else None
    ray.init(address=_node.address, log_to_driver=worker_logs, runtime_env=runtime_env)


def started() -> bool:
    """Whether this process runs on a Ray node it started (not one it was given)."""
    return _node is not None


def stop() -> None:
    """Disconnect, and stop the node ``start`` started (if it did)."""
    global _node, _warm
    import ray

    if ray.is_initialized():
        ray.shutdown()
    if _node is not None:
        _node.kill_all_processes(check_alive=False, allow_graceful=True)
        _node = None
    if _warm is not None:
        _warm.stop()
        _warm = None
