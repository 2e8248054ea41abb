"""Swarm's trainer agent: one worker fronting a Ray cluster, running LoRA jobs with Ray Train."""

import os

# Before anything imports Ray: its C++ failure-signal handler turns the SIGTERM that asks the
# agent for a graceful stop (hand its jobs back from a checkpoint) into an abort at exit.
os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
# Ray Train's controller learns that a run finished (or took a cancel) only when it next polls
# its workers, every 2 s by default: a cost paid at every job's start and end. A poll is one
# small remote call per worker, so a quarter second is cheap.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")
# The preemption watcher follows node drains of a Ray autoscaler; an agent's cluster has none
# (the scheduler moves jobs between workers), and the watcher is one more process per run.
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
