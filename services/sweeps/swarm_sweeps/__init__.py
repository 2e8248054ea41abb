"""The sweeps service: hyperparameter sweeps whose trials are ordinary jobs."""
