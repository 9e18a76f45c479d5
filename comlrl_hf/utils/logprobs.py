"""Per-token log-probabilities of completions from one padded forward pass."""

from __future__ import annotations

import torch

from ._trl_compat import entropy_from_logits, selective_log_softmax


def completion_logps(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    keep_logits_only_for_completion: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log pi(completion token | prompt, previous tokens) of shape [R, T], and optionally the entropies.
    `keep_logits_only_for_completion` passes `logits_to_keep` (for models whose forward accepts it).

    Prompts are left-padded and completions right-padded, so the pair forms one contiguous row; logits are
    divided by the sampling temperature so they score the distribution that was sampled.
    """
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    prompt_len, completion_len = prompt_ids.shape[1], completion_ids.shape[1]
    # Positions as `generate` assigns them to left-padded rows: count only attended tokens.
    position_ids = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)
    kwargs = {"logits_to_keep": completion_len + 1} if keep_logits_only_for_completion else {}
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **kwargs
    ).logits
    # The logit at position t predicts token t+1: keep the ones predicting completion tokens. With
    # `logits_to_keep` the model projects only the last T+1 positions onto the vocabulary (the prompt's
    # other positions never need it: with a 49k vocabulary that is most of the LM-head work).
    start = logits.shape[1] - completion_len - 1
    logits = logits[:, start : start + completion_len, :]
    if temperature != 1.0:
        logits = logits / temperature
    logps = selective_log_softmax(logits, completion_ids)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach())
    return logps, entropy
