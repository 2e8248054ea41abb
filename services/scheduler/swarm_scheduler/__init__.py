"""The scheduler: turns queued jobs into assignments on workers that fit."""
