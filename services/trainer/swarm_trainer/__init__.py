"""Swarm's trainer agent: one worker fronting a Ray cluster, running LoRA jobs with Ray Train."""
