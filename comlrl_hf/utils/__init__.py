"""Utilities below the trainers: model sources, log-probabilities, advantages and losses."""
