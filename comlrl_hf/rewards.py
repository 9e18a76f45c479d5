"""Small joint reward functions used by the examples, tests and demo (all plain Python, no models)."""

from __future__ import annotations

import math
import re


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


def format_reward(*completions: list[str], pattern: str = r"\S.*[.!?]") -> list[float]:
    """The share of agents whose stripped answer matches the regular expression `pattern` as a whole
    (`re.fullmatch`, `.` matching newlines). The default asks for a non-empty answer ending a sentence."""
    regex = re.compile(pattern, re.DOTALL)
    return [
        sum(regex.fullmatch(answer.strip()) is not None for answer in joint) / len(joint)
        for joint in zip(*completions)
    ]


def exact_match_reward(*completions: list[str], batch_items: list[dict], answer_key: str = "answer") -> list[float]:
    """The share of agents whose stripped answer equals the dataset item's `answer_key` column (stripped)."""
    rewards = []
    for joint, item in zip(zip(*completions), batch_items):
        if answer_key not in item:
            raise ValueError(f"exact_match_reward needs a {answer_key!r} column; the item has {sorted(item)}")
        target = str(item[answer_key]).strip()
        rewards.append(sum(answer.strip() == target for answer in joint) / len(joint))
    return rewards


# The rewards the `comlrl-hf` command knows by name (`reward_func: length_ratio` in a recipe).
BUILTIN_REWARDS = {
    "length_ratio": length_ratio_reward,
    "format": format_reward,
    "exact_match": exact_match_reward,
    "space_share": space_share_reward,
}
