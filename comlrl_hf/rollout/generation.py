"""Batched generation: one `generate` call per agent for all prompts x num_generations."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from .sampling import for_model

Prompt = str | list  # plain text, or a conversation (list of {"role", "content"} messages)


@dataclass
class AgentRollout:
    """One agent's side of a batch of rollouts; rows are prompt-major: row b*K + k is prompt b, sample k."""

    prompt_ids: torch.Tensor  # [R, P], left-padded
    prompt_mask: torch.Tensor  # [R, P]
    completion_ids: torch.Tensor  # [R, T], right-padded
    completion_mask: torch.Tensor  # [R, T], 1 up to and including the first EOS
    completions: list[str]  # decoded, special tokens removed
    old_logps: torch.Tensor | None = None  # [R, T], set when a rollout is reused (ratio clipping)
    ref_logps: torch.Tensor | None = None  # [R, T], set when beta != 0

    @property
    def completion_lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(dim=1)


def render_prompts(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[Prompt]) -> tuple[list[str], bool]:
    """Conversations go through the tokenizer's chat template (TRL's convention); text stays as it is."""
    if all(isinstance(p, str) for p in prompts):
        return list(prompts), False
    if any(isinstance(p, str) for p in prompts):
        kinds = sorted({type(p).__name__ for p in prompts})
        raise ValueError(f"one agent's prompts mix plain text and chat messages ({kinds}); a formatter must return one kind")
    for i, p in enumerate(prompts):
        if not (isinstance(p, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in p)):
            raise ValueError(
                f"prompt {i} must be a string or a list of {{'role', 'content'}} messages, got {type(p).__name__}: {p!r:.200}"
            )
    rendered = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    return rendered, True


def completion_mask_from_eos(completion_ids: torch.Tensor, eos_token_id: int | Sequence[int]) -> torch.Tensor:
    """1 for tokens up to and including the first EOS of each row, 0 after it (padding)."""
    eos_ids = torch.as_tensor(eos_token_id if isinstance(eos_token_id, Sequence) else [eos_token_id])
    is_eos = torch.isin(completion_ids, eos_ids.to(completion_ids.device))
    length = completion_ids.shape[1]
    first_eos = torch.where(
        is_eos.any(dim=1), is_eos.int().argmax(dim=1), torch.full_like(is_eos[:, 0], length, dtype=torch.long)
    )
    positions = torch.arange(length, device=completion_ids.device).expand_as(completion_ids)
    return (positions <= first_eos.unsqueeze(1)).long()


def eos_token_ids(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The tokenizer's EOS plus the model's generation-config EOS ids (chat models end turns with several)."""
    ids = [tokenizer.eos_token_id]
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for token in configured if isinstance(configured, (list, tuple)) else [configured]:
        if token is not None and token not in ids:
            ids.append(int(token))
    return ids


@torch.no_grad()
def generate_completions(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[Prompt],
    num_generations: int,
    generation_kwargs: dict,
) -> AgentRollout:
    """Sample `num_generations` completions for every prompt in one `generate` call (eval mode, KV cache)."""
    texts, templated = render_prompts(tokenizer, prompts)
    device = next(model.parameters()).device
    eos_ids = eos_token_ids(model, tokenizer)
    encoded = tokenizer(
        texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=not templated
    ).to(device)
    prompt_ids = encoded["input_ids"].repeat_interleave(num_generations, dim=0)
    prompt_mask = encoded["attention_mask"].repeat_interleave(num_generations, dim=0)
    was_training = model.training
    model.eval()  # no dropout, and activation checkpointing stays off so the KV cache works
    try:
        sequences = model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=eos_ids,
            **for_model(model, generation_kwargs),
        )
    finally:
        model.train(was_training)
    completion_ids = sequences[:, prompt_ids.shape[1] :]
    completion_mask = completion_mask_from_eos(completion_ids, eos_ids)
    lengths = completion_mask.sum(dim=1).tolist()
    completions = tokenizer.batch_decode(
        [row[:n] for row, n in zip(completion_ids.tolist(), lengths)], skip_special_tokens=True
    )
    return AgentRollout(prompt_ids, prompt_mask, completion_ids, completion_mask, completions)


@torch.no_grad()
def generate_completions_with_adapters(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts_per_agent: Sequence[Sequence[Prompt]],
    adapter_names: Sequence[str],
    num_generations: int,
    generation_kwargs: dict,
) -> list[AgentRollout]:
    """Every agent's completions from one `generate` call on a shared-base `PeftModel`: the rows of agent i
    run adapter `adapter_names[i]` (`generate(adapter_names=...)`, eval mode only). The result equals one
    `generate_completions` per agent with its adapter active, with each agent's padding trimmed to its own rows."""
    rendered = [render_prompts(tokenizer, prompts) for prompts in prompts_per_agent]
    texts = [t for agent_texts, _ in rendered for t in agent_texts]
    templated = {flag for _, flag in rendered}
    if len(templated) > 1:
        raise ValueError("some agents' prompts are chat messages and others plain text; a mixed-adapter batch needs one kind")
    device = next(model.parameters()).device
    eos_ids = eos_token_ids(model, tokenizer)
    encoded = tokenizer(
        texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=not templated.pop()
    ).to(device)
    prompt_ids = encoded["input_ids"].repeat_interleave(num_generations, dim=0)
    prompt_mask = encoded["attention_mask"].repeat_interleave(num_generations, dim=0)
    rows = [len(p) * num_generations for p in prompts_per_agent]
    names = [name for name, n in zip(adapter_names, rows) for _ in range(n)]
    was_training = model.training
    model.eval()
    try:
        sequences = model.generate(
            input_ids=prompt_ids, attention_mask=prompt_mask, adapter_names=names,
            pad_token_id=tokenizer.pad_token_id, eos_token_id=eos_ids, **for_model(model, generation_kwargs),
        )
    finally:
        model.train(was_training)
    completion_ids = sequences[:, prompt_ids.shape[1] :]
    completion_mask = completion_mask_from_eos(completion_ids, eos_ids)
    out, start = [], 0
    for n in rows:
        p_ids, p_mask = prompt_ids[start : start + n], prompt_mask[start : start + n]
        c_ids, c_mask = completion_ids[start : start + n], completion_mask[start : start + n]
        start += n
        first = int(p_mask.any(dim=0).int().argmax())  # drop the columns that only pad other agents' prompts
        length = int(c_mask.sum(dim=1).max()) if n else 0  # and the steps only other agents' rows needed
        p_ids, p_mask, c_ids, c_mask = p_ids[:, first:], p_mask[:, first:], c_ids[:, :length], c_mask[:, :length]
        lengths = c_mask.sum(dim=1).tolist()
        texts_i = tokenizer.batch_decode([row[:k] for row, k in zip(c_ids.tolist(), lengths)], skip_special_tokens=True)
        out.append(AgentRollout(p_ids, p_mask, c_ids, c_mask, texts_i))
    return out
