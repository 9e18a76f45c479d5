r"""Group baselines for joint rewards (pure functions, unit-tested).

For one prompt, the N agents produce K joint actions with joint rewards $R_1..R_K$. Every agent's
completion $k$ gets the advantage $A_k = (R_k - b_k) / s$ where the baseline $b_k$ is

- ``"mean"`` (MAGRPO):      $b_k = \bar R = \frac1K \sum_j R_j$
- ``"raw"`` (MAREINFORCE):  $b_k = 0$
- ``"max"`` (MAReMax):      $b_k = \max_j R_j$  (the best sample of the group stands in for ReMax's greedy rollout)
- ``"rloo"`` (MARLOO):      $b_k = \frac1{K-1} \sum_{j \ne k} R_j$  (leave one out)

and the scale $s$ is the standard deviation of the rewards of the group (``"group"``), of the whole
batch (``"batch"``), or 1 (``"none"``; also used where that standard deviation is ~0). Unlike the original comlrl, the advantages are *not*
re-centred after the baseline: z-normalising $A$ would make the four baselines identical.
"""

from __future__ import annotations

import torch

ADVANTAGE_MODES = ("mean", "raw", "max", "rloo")
SCALE_REWARDS = ("group", "batch", "none")


def group_advantages(rewards: torch.Tensor, mode: str = "mean", scale: str = "group", eps: float = 1e-4) -> torch.Tensor:
    """Advantages for `rewards` of shape [B, K] (B prompts, K joint actions each)."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape [prompts, generations], got {tuple(rewards.shape)}")
    num_generations = rewards.shape[1]
    if mode == "mean":
        baseline = rewards.mean(dim=1, keepdim=True)
    elif mode == "raw":
        baseline = torch.zeros_like(rewards)
    elif mode == "max":
        baseline = rewards.max(dim=1, keepdim=True).values
    elif mode == "rloo":
        if num_generations < 2:
            raise ValueError("the leave-one-out baseline needs num_generations >= 2")
        baseline = (rewards.sum(dim=1, keepdim=True) - rewards) / (num_generations - 1)
    else:
        raise ValueError(f"advantage mode must be one of {ADVANTAGE_MODES}, got {mode!r}")
    advantages = rewards - baseline
    if scale in ("group", "batch"):
        if scale == "group":
            std = rewards.std(dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(rewards[:, :1])
        else:
            std = rewards.std() if rewards.numel() > 1 else rewards.new_zeros(())
        # A group whose rewards are all equal carries no scale: leave it unscaled rather than divide by ~0
        # (with the "raw" or "max" baselines its advantages are not zero).
        advantages = advantages / torch.where(std > eps, std + eps, torch.ones_like(std))
    elif scale != "none":
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale!r}")
    return advantages


def tree_gae(
    rewards: list[torch.Tensor],
    values: list[torch.Tensor],
    next_row: list[list[int | None]],
    gamma: float,
    lam: float,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    r"""Generalized advantage estimation over turns, for rows that continue in a row of the next turn.

    For row $n$ of turn $t$ with value $V_t$, reward $r_t$ and successor row $c$ (None at the end of an
    episode, where $V_{t+1} = 0$ and $A_{t+1} = 0$):
    $\delta_t = r_t + \gamma V_{t+1}(c) - V_t$, $A_t = \delta_t + \gamma \lambda A_{t+1}(c)$, target $= A_t + V_t$.
    $\lambda = 0$ is TD(0) (the original comlrl), $\lambda = 1$ the Monte-Carlo return minus $V_t$.
    Returns (advantages, value targets), one tensor per turn.
    """
    advantages = [torch.zeros_like(r) for r in rewards]
    for t in range(len(rewards) - 1, -1, -1):
        for n, child in enumerate(next_row[t]):
            next_value = values[t + 1][child] if child is not None else 0.0
            next_advantage = advantages[t + 1][child] if child is not None else 0.0
            delta = rewards[t][n] + gamma * next_value - values[t][n]
            advantages[t][n] = delta + gamma * lam * next_advantage
    targets = [a + v for a, v in zip(advantages, values)]
    return advantages, targets
