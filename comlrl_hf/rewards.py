"""Small joint reward functions used by the examples, tests and demo (all plain Python, no models)."""

from __future__ import annotations

import math


def length_ratio_reward(completions1: list[str], completions2: list[str]) -> list[float]:
    """Spec §6: the second agent should answer 2 to 3 times longer (in characters) than the first.
    1.0 inside [2, 3], exp(-distance to the interval) outside."""
    rewards = []
    for first, second in zip(completions1, completions2):
        ratio = len(second) / max(len(first), 1)
        distance = 0.0 if 2 <= ratio <= 3 else min(abs(ratio - 2), abs(ratio - 3))
        rewards.append(math.exp(-distance))
    return rewards


def space_share_reward(completions1: list[str], completions2: list[str]) -> list[float]:
    """The mean share of spaces in both answers: learnable in a few dozen steps even by random tiny models."""
    return [sum(c.count(" ") / max(len(c), 1) for c in pair) / 2 for pair in zip(completions1, completions2)]
