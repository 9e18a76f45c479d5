"""Preference-learning math, free of trainers: choosing pairs and the Bradley-Terry loss.

For a prompt with M joint candidates scored r_1..r_M by the task reward, the candidate pairs are every
ordered (w, l) with r_w > r_l (ties carry no preference and are dropped). A reward model r_phi learns
P(w > l) = sigma(r_phi(w) - r_phi(l)) by minimising  L = -mean log sigma(r_phi(w) - r_phi(l)).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PAIR_SELECTIONS = ("reward_gap", "random", "all")


def select_pairs(
    rewards: list[float], selection: str, count: int | None, generator: torch.Generator | None = None
) -> list[tuple[int, int]]:
    """(winner, loser) candidate indices for one prompt.

    - `"reward_gap"`: the `count` pairs with the largest reward gap (ties in the gap keep index order);
    - `"random"`: `count` pairs drawn without replacement with `generator`;
    - `"all"`: every strictly ordered pair (`count` must be None).
    """
    if selection not in PAIR_SELECTIONS:
        raise ValueError(f"pair_selection must be one of {PAIR_SELECTIONS}, got {selection!r}")
    pairs = [(w, l) for w in range(len(rewards)) for l in range(len(rewards)) if rewards[w] > rewards[l]]
    if selection == "all":
        return pairs
    if selection == "reward_gap":
        pairs.sort(key=lambda p: rewards[p[0]] - rewards[p[1]], reverse=True)  # stable: index order on equal gaps
    else:
        order = torch.randperm(len(pairs), generator=generator).tolist()
        pairs = [pairs[i] for i in order]
    return pairs[:count]


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(-mean log sigma(chosen - rejected), accuracy = share of pairs with chosen > rejected)."""
    margin = chosen.float() - rejected.float()
    return -F.logsigmoid(margin).mean(), (margin > 0).float().mean()
