"""The joint reward model of preference-based RL: a causal-LM backbone with a scalar head on the last
non-padding token, i.e. `AutoModelForSequenceClassification(num_labels=1)` (the pooling TRL's RewardTrainer
uses), so a trained reward model saves and loads with `from_pretrained` and pushes like any HF model."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedModel

from ..utils.prompts import prompt_text
from ..utils.seeding import seeded_stream
from ..utils.model_sources import load_kwargs

logger = logging.getLogger(__name__)


def resolve_reward_model_device(requested: str | None, trainer_device: torch.device) -> torch.device:
    """`None` -> the trainer's device; a CUDA device on a machine without CUDA -> the trainer's device, with
    a warning (the spec's default is "cuda:0"); a device that does not exist -> ValueError."""
    if requested is None:
        return torch.device(trainer_device)
    try:
        device = torch.device(requested)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"reward_model_device={requested!r} is not a torch device: {error}") from error
    if device.type == "cuda":
        if not torch.cuda.is_available():
            logger.warning("reward_model_device=%r but CUDA is not available; using %s", requested, trainer_device)
            return torch.device(trainer_device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise ValueError(
                f"reward_model_device={requested!r} does not exist: {torch.cuda.device_count()} CUDA device(s) visible"
            )
        return torch.device("cuda", index)
    if device.type != "cpu":
        backend = getattr(torch, device.type, None)
        if backend is None or not getattr(backend, "is_available", lambda: False)():
            raise ValueError(f"reward_model_device={requested!r} is not available on this machine")
    return device


def load_reward_model(
    source: str | os.PathLike, model_config: dict | None, device: torch.device, seed: int
) -> tuple[PreTrainedModel, object]:
    """The backbone at `source` with a fresh scalar head (initialised from `seed`, without touching the
    caller's random streams) and its own tokenizer, on `device`."""
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError(f"the reward model's tokenizer ({source}) has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    with seeded_stream(seed):
        model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=1, **load_kwargs(model_config))
    model.config.pad_token_id = tokenizer.pad_token_id  # the head pools the last non-pad token
    return own_memory(model.to(device)), tokenizer


def own_memory(model: torch.nn.Module) -> torch.nn.Module:
    """Copy every tensor into freshly allocated memory. Loaded tensors sit at whatever alignment the file gave,
    and CPU kernels round differently at different alignments: without this, a reward model restored from a
    checkpoint would score a few ulps away from the one that was saved, and a resumed run would drift."""
    for tensor in list(model.parameters()) + list(model.buffers()):
        tensor.data = tensor.data.clone()
    return model


def joint_text(prompts: Sequence, completions: Sequence[str]) -> str:
    """What the reward model reads: every agent's prompt and response, in role order."""
    return "\n\n".join(
        f"[Agent {i} prompt]\n{prompt_text(p)}\n[Agent {i} response]\n{c}" for i, (p, c) in enumerate(zip(prompts, completions))
    )


def reward_scores(model, tokenizer, texts: list[str], max_length: int | None, batch_size: int = 32) -> torch.Tensor:
    """One scalar per text (in float32, on the CPU), with gradients when they are enabled."""
    device = next(model.parameters()).device
    scores = []
    for start in range(0, len(texts), batch_size):
        encoded = tokenizer(
            texts[start : start + batch_size], return_tensors="pt", padding=True, padding_side="right",
            truncation=max_length is not None, max_length=max_length,
        ).to(device)
        scores.append(model(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"]).logits[:, 0].float())
    return torch.cat(scores).cpu() if scores else torch.zeros(0)
