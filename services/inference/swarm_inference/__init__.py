"""Swarm's inference worker: base models held once, LoRA adapters batched together."""
