"""Sampling with temperature + top-k + top-p that touches only the top-k survivors.

`generate(do_sample=True, temperature=T, top_k=k, top_p=p)` runs three warpers and then draws over the whole
vocabulary (49k entries for SmolLM2): top-p sorts all of it although top-k already set all but k to -inf (23% of
CPU generation time), and `multinomial` draws one exponential per vocabulary entry (6%)
(benchmarks/compare_comlrl.py, docs/performance.md). `TopKTopPSampler` takes the k largest logits once, applies
temperature and top-p to those k, draws the token among them, and hands `generate` scores whose argmax is that
token, so `generate` runs greedy.

The kept set is exactly HF's: top-k keeps every logit >= the k-th largest, and top-p removes the survivors whose
ascending cumulative probability is <= 1 - p, keeping at least one; the kept logits are divided by T as HF does.
The draw is from the same distribution as HF's, but not the same draw for a given seed (it consumes the torch
RNG differently). The only numerical difference is the order in which the softmax denominator is summed (k terms
here, k terms plus exact zeros in HF), which can move a cumulative sum by an ulp. Logits tied with the k-th all
survive, as in HF (the top-k is widened to cover the tie).
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper


class TopKTopPSampler(LogitsProcessor):
    """`TemperatureLogitsWarper(T)`, `TopKLogitsWarper(k)`, `TopPLogitsWarper(p)` and the draw in one step, for
    greedy `generate` (see the module docstring)."""

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

    def kept(self, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(logits / T of the top-k survivors, with -inf for those top-p removes; their vocabulary indices), or None
        when top-k keeps the whole vocabulary. Like TopKLogitsWarper, every logit tied with the k-th survives:
        frequent in bf16, whose coarse grid makes equal logits common."""
        scaled = scores / self.temperature  # TemperatureLogitsWarper's division, before top-k as in generate
        k = min(self.top_k, scaled.shape[-1])
        if k == scaled.shape[-1]:
            return None
        values, indices = torch.topk(scaled, k, dim=-1)  # descending
        kth = values[:, -1:]
        width = int((scaled >= kth).sum(dim=-1).max())
        if width > k:  # some row ties its k-th logit: widen to every tied logit, then drop what is below each row's k-th
            values, indices = torch.topk(scaled, width, dim=-1)
            values = values.masked_fill(values < kth, -float("inf"))
        if self.top_p < 1.0:
            # TopPLogitsWarper on the survivors: ascending cumulative mass, drop while <= 1 - p, keep the largest
            cumulative = values.flip(-1).softmax(dim=-1).cumsum(dim=-1)
            remove = (cumulative <= (1 - self.top_p)).flip(-1)
            remove[:, 0] = False
            values = values.masked_fill(remove, -float("inf"))
        return values, indices

    def filter(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        """The warped scores over the whole vocabulary (-inf outside the kept set), as HF's chain returns them."""
        kept = self.kept(scores)
        if kept is None:
            return self.reference(input_ids, scores)
        return torch.full_like(scores, -float("inf")).scatter_(-1, kept[1], kept[0])

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        """Draw the next token from the kept set and return scores whose argmax is that token (0 there, -inf
        elsewhere): `generate` then runs greedy and never draws over the whole vocabulary."""
        kept = self.kept(scores)
        if kept is None:
            probs = self.reference(input_ids, scores).softmax(dim=-1)
            chosen = torch.multinomial(probs, 1)
        else:
            kept_logits, kept_indices = kept
            chosen = kept_indices.gather(-1, torch.multinomial(kept_logits.softmax(dim=-1), 1))
        return torch.full_like(scores, -float("inf")).scatter_(-1, chosen, 0.0)


def sampling_kwargs(temperature: float, top_k: int | None, top_p: float) -> dict:
    """`generate` keyword arguments for sampling with (T, k, p): with top-k on, greedy decoding over the scores of
    `TopKTopPSampler`, which draws the token itself; HF's own sampling otherwise (no top-k: nothing to gain)."""
    if not top_k:
        return {"do_sample": True, "temperature": float(temperature), "top_p": float(top_p), "top_k": 0}
    return {
        "do_sample": False, "temperature": None, "top_k": None, "top_p": None,
        "logits_processor": LogitsProcessorList([TopKTopPSampler(float(temperature), int(top_k), float(top_p))]),
    }


def _extra_sampling_settings(generation_config) -> list[str]:
    """Settings of a model's generation_config that transformers applies only when sampling (or that turn
    `generate` into beam search): with any of them, greedy decoding over the sampler's scores would drop them."""
    if generation_config is None:
        return []
    checks = {
        "num_beams": lambda v: v is not None and v > 1, "min_p": lambda v: v is not None,
        "typical_p": lambda v: v is not None and v < 1.0, "epsilon_cutoff": lambda v: v is not None and v > 0,
        "eta_cutoff": lambda v: v is not None and v > 0, "top_h": lambda v: v is not None,
    }
    return [name for name, is_set in checks.items() if is_set(getattr(generation_config, name, None))]


def for_model(model, generation_kwargs: dict) -> dict:
    """`generation_kwargs` for this model: the sampler's, unless the model's generation_config sets something only
    transformers' sampling path applies (`min_p`, `typical_p`, beams, ...); then transformers' own sampling with
    the same temperature/top-k/top-p, so those settings keep working as before."""
    processors = generation_kwargs.get("logits_processor") or []
    sampler = next((p for p in processors if isinstance(p, TopKTopPSampler)), None)
    if sampler is None or not _extra_sampling_settings(getattr(model, "generation_config", None)):
        return generation_kwargs
    rest = {k: v for k, v in generation_kwargs.items() if k not in ("logits_processor", "do_sample", "temperature", "top_k", "top_p")}
    others = [p for p in processors if p is not sampler]
    if others:
        rest["logits_processor"] = LogitsProcessorList(others)
    return {**rest, "do_sample": True, "temperature": sampler.temperature, "top_k": sampler.top_k, "top_p": sampler.top_p}
