"""Utilities below the trainers: checkpoint metadata, model sources, log-probabilities, advantages, losses."""

from .checkpoint import CheckpointError, read_checkpoint_metadata

__all__ = ["CheckpointError", "read_checkpoint_metadata"]
