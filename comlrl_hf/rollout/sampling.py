"""Temperature + top-k + top-p in one logits processor that sorts only the top-k survivors.

`generate(temperature=T, top_k=k, top_p=p)` runs three warpers; the top-p one sorts the whole vocabulary
(49k entries for SmolLM2) although top-k already set all but k of them to -inf. On CPU that sort was 23% of
generation time (benchmarks/compare_comlrl.py, docs/performance.md). This processor takes the k largest
logits once, applies top-p to those k only, and writes -inf elsewhere.

It keeps exactly the tokens HF's chain keeps: top-k keeps every logit >= the k-th largest (ties included), and
top-p removes the survivors whose ascending cumulative probability is <= 1 - p, keeping at least one. The kept
logits are divided by T with the same operation HF uses, so the sampling distribution is HF's; the only
difference is the order in which the softmax denominator is summed (k terms here, k terms plus exact zeros
there), which can move a cumulative sum by an ulp. A row whose k-th logit is tied with the (k+1)-th falls back
to HF's own warpers, since `topk` would drop part of the tie.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper


class TopKTopPSampler(LogitsProcessor):
    """`TemperatureLogitsWarper(T)`, `TopKLogitsWarper(k)` and `TopPLogitsWarper(p)` in one step (see module)."""

    def __init__(self, temperature: float, top_k: int, top_p: float):
        if not (isinstance(top_k, int) and top_k > 0):
            raise ValueError(f"top_k must be a positive int, got {top_k!r}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        self.temperature, self.top_k, self.top_p = float(temperature), top_k, float(top_p)
        self._reference = [TemperatureLogitsWarper(self.temperature), TopKLogitsWarper(top_k)]
        if self.top_p < 1.0:
            self._reference.append(TopPLogitsWarper(self.top_p))

    def reference(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        """HF's three warpers, in `generate`'s order."""
        for warper in self._reference:
            scores = warper(input_ids, scores)
        return scores

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        k = min(self.top_k, scores.shape[-1])
        if k == scores.shape[-1]:
            return self.reference(input_ids, scores)
        top_values, top_indices = torch.topk(scores, k + 1, dim=-1)  # descending; column k shows a tie at the edge
        if bool((top_values[:, k] == top_values[:, k - 1]).any()):
            return self.reference(input_ids, scores)
        kept_logits = top_values[:, :k] / self.temperature  # the division TemperatureLogitsWarper does
        kept_indices = top_indices[:, :k]
        if self.top_p < 1.0:
            # TopPLogitsWarper on the survivors: ascending order, cumulative mass, drop while <= 1 - p
            ascending = kept_logits.flip(-1)
            cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
            remove = cumulative <= (1 - self.top_p)
            remove[:, -1] = False
            # topk breaks ties among survivors by index, sort by its own order; the tokens dropped are the same
            # unless two equal logits straddle the cut, where either choice matches some valid sort order
            keep = ~remove.flip(-1)
            kept_logits = kept_logits.masked_fill(~keep, -float("inf"))
        out = torch.full_like(scores, -float("inf"))
        return out.scatter_(-1, kept_indices, kept_logits)


def sampling_kwargs(temperature: float, top_k: int | None, top_p: float) -> dict:
    """`generate` keyword arguments for sampling with (T, k, p): the fused processor when top-k is on (HF's own
    temperature/top-k/top-p warpers switched off), HF's warpers otherwise (no top-k: nothing to gain)."""
    if not top_k:
        return {"temperature": float(temperature), "top_p": float(top_p), "top_k": 0}
    return {
        "temperature": 1.0, "top_k": 0, "top_p": 1.0,
        "logits_processor": LogitsProcessorList([TopKTopPSampler(float(temperature), int(top_k), float(top_p))]),
    }
