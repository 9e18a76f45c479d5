"""Generation that does not depend on the batch: each prompt's group in its own seeded `generate` call.

Batched sampling draws every row from one RNG stream and pads every prompt to the batch's longest, so a
prompt's samples change with the prompts beside it. Data-parallel training splits a global batch across
processes, which changes exactly that; `generate_per_prompt` makes a prompt's K samples a function of
(model, prompt, seed) only, so N processes reproduce one process (`MultiAgentConfig.seed_generation_per_prompt`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from ..utils.seeding import seeded_stream
from .generation import AgentRollout, Prompt, generate_completions


def prompt_seed(*parts: int | str) -> int:
    """A 63-bit seed from (seed, step, dataset index, agent, ...), stable across processes and runs."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def _pad_to(t: torch.Tensor, width: int, value: int, left: bool) -> torch.Tensor:
    extra = width - t.shape[1]
    if extra <= 0:
        return t
    pad = torch.full((t.shape[0], extra), value, dtype=t.dtype, device=t.device)
    return torch.cat([pad, t] if left else [t, pad], dim=1)


def merge_rollouts(parts: Sequence[AgentRollout], pad_token_id: int) -> AgentRollout:
    """Concatenate per-prompt rollouts into one prompt-major batch: prompts left-padded, completions
    right-padded (mask 0), the layout `generate_completions` returns."""
    p_width = max(r.prompt_ids.shape[1] for r in parts)
    c_width = max(r.completion_ids.shape[1] for r in parts)
    return AgentRollout(
        torch.cat([_pad_to(r.prompt_ids, p_width, pad_token_id, True) for r in parts]),
        torch.cat([_pad_to(r.prompt_mask, p_width, 0, True) for r in parts]),
        torch.cat([_pad_to(r.completion_ids, c_width, pad_token_id, False) for r in parts]),
        torch.cat([_pad_to(r.completion_mask, c_width, 0, False) for r in parts]),
        [text for r in parts for text in r.completions],
    )


def generate_per_prompt(
    model: torch.nn.Module,
    tokenizer,
    prompts: Sequence[Prompt],
    num_generations: int,
    generation_kwargs: dict,
    seeds: Sequence[int],
) -> AgentRollout:
    """`generate_completions`, one call per prompt, each under its own seed in a forked RNG (the global RNG
    streams are left as they were)."""
    if len(seeds) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
    parts = []
    for prompt, seed in zip(prompts, seeds):
        with seeded_stream(seed):
            parts.append(generate_completions(model, tokenizer, [prompt], num_generations, generation_kwargs))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return merge_rollouts(parts, pad)
