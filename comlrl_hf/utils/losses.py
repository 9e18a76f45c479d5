r"""The clipped policy-gradient loss (pure function, unit-tested).

Per completion token $t$ of sequence $i$, with ratio $\rho_{i,t} = \pi_\theta / \pi_{\theta_{old}}$:

    $\ell_{i,t} = -\min(\rho_{i,t} A_i,\ \mathrm{clip}(\rho_{i,t}, 1-\epsilon_{low}, 1+\epsilon_{high}) A_i) + \beta\,\mathrm{KL}_{i,t}$

with the k3 estimator $\mathrm{KL} = e^{r-p} - (r-p) - 1$ against a reference policy (``r``: reference
log-prob, ``p``: current log-prob). The mask keeps completion tokens up to and including the first EOS;
prompt and padding never count. Normalisation (``loss_type``):

- ``"grpo"``: mean over each sequence's tokens, then mean over sequences (the default);
- ``"dapo"``: sum over all tokens / number of tokens in the micro-batch;
- ``"dr_grpo"``: sum over all tokens / (sequences x max_new_tokens), free of any length bias.

When a rollout is used once (``num_ppo_epochs=1``) ``old_logps`` is the detached current log-prob, so
$\rho = 1$ and the gradient is the plain policy gradient $-A \nabla \log \pi$.
"""

from __future__ import annotations

import torch

LOSS_TYPES = ("grpo", "dapo", "dr_grpo")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def policy_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon_low: float = 0.2,
    epsilon_high: float | None = None,
    loss_type: str = "grpo",
    ref_logps: torch.Tensor | None = None,
    beta: float = 0.0,
    max_completion_length: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss and diagnostics for per-token `logps` [R, T], per-sequence `advantages` [R], `mask` [R, T]."""
    epsilon_high = epsilon_low if epsilon_high is None else epsilon_high
    mask = mask.to(logps.dtype)
    ratio = torch.exp(logps - old_logps)
    adv = advantages.to(logps.dtype).unsqueeze(1)
    per_token = -torch.min(ratio * adv, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * adv)
    stats: dict[str, torch.Tensor] = {}
    if beta != 0.0:
        if ref_logps is None:
            raise ValueError("beta != 0 needs ref_logps")
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + beta * kl
        stats["kl"] = masked_mean(kl.detach(), mask)
    if loss_type == "grpo":
        loss = ((per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).mean()
    elif loss_type == "dapo":
        loss = masked_mean(per_token, mask)
    elif loss_type == "dr_grpo":
        if not max_completion_length:
            raise ValueError("loss_type='dr_grpo' needs max_completion_length")
        loss = (per_token * mask).sum() / (per_token.shape[0] * max_completion_length)
    else:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    with torch.no_grad():
        clipped = ((ratio < 1 - epsilon_low) & (adv < 0)) | ((ratio > 1 + epsilon_high) & (adv > 0))
        stats["clip_ratio"] = masked_mean(clipped.to(logps.dtype), mask)
    return loss, stats


def value_loss(
    values: torch.Tensor, targets: torch.Tensor, old_values: torch.Tensor | None = None, clip_range: float | None = None
) -> torch.Tensor:
    """Mean squared error to the targets; with `clip_range`, PPO's pessimistic clipped variant
    max((V - t)^2, (V_old + clip(V - V_old, -c, c) - t)^2)."""
    loss = (values - targets) ** 2
    if clip_range is not None and old_values is not None:
        clipped = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
        loss = torch.max(loss, (clipped - targets) ** 2)
    return loss.mean()
