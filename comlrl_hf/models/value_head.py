"""Value heads on causal-LM backbones (TRL 1.x no longer ships value-head models).

A critic is a causal LM with a `value_head` attribute: `ValueHead(hidden)` maps the backbone's last
hidden state at each position to a scalar. The shared IAC mode attaches the head to the actor itself.
On disk the backbone is a normal `from_pretrained` folder and the head is `value_head.pt` beside it.
"""

from __future__ import annotations

import os

import torch
from torch import nn

VALUE_HEAD_NAME = "value_head.pt"


class ValueHead(nn.Module):
    """Linear -> 1, or Linear -> Tanh -> Linear -> 1 with `hidden_dim`; weights N(0, 0.02), zero bias."""

    def __init__(self, hidden_size: int, hidden_dim: int | None = None, seed: int | None = None):
        super().__init__()
        if hidden_dim is not None and (not isinstance(hidden_dim, int) or hidden_dim < 1):
            raise ValueError(f"value head hidden_dim must be a positive integer or None, got {hidden_dim!r}")
        layers = [nn.Linear(hidden_size, hidden_dim), nn.Tanh(), nn.Linear(hidden_dim, 1)] if hidden_dim else [nn.Linear(hidden_size, 1)]
        self.net = nn.Sequential(*layers)
        # Seeded on its own, so the same seed gives the same head whatever ran before (resume compares runs).
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        for layer in self.net:
            if isinstance(layer, nn.Linear):
                nn.init.normal_(layer.weight, std=0.02, generator=generator)
                nn.init.zeros_(layer.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.net(hidden.to(self.net[0].weight.dtype)).squeeze(-1)


def attach_value_head(model: nn.Module, hidden_dim: int | None, seed: int | None = None) -> nn.Module:
    """Give `model` a fresh `value_head` on its device and dtype."""
    weight = model.get_input_embeddings().weight
    model.value_head = ValueHead(model.config.hidden_size, hidden_dim, seed).to(device=weight.device, dtype=weight.dtype)
    return model


def token_values(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Values [B, L] at every position, from the backbone's last hidden state (no LM-head logits computed)."""
    position_ids = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)
    # PEFT models (and shared-base adapter views) expose the transformers model through `get_base_model()`
    backbone = model.get_base_model().base_model if hasattr(model, "get_base_model") else model.base_model
    hidden = backbone(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    ).last_hidden_state
    return model.value_head(hidden)


def save_with_value_head(model: nn.Module, directory: str, tokenizer=None, state_dict: dict | None = None) -> None:
    """`directory/` as a `from_pretrained` folder (without the head) plus `directory/value_head.pt`;
    `state_dict`: the weights to write instead of the live ones (no value head)."""
    os.makedirs(directory, exist_ok=True)
    if state_dict is not None:
        model.save_pretrained(directory, state_dict=state_dict)
    elif getattr(model, "value_head", None) is None:
        model.save_pretrained(directory)
    else:
        model.save_pretrained(directory, state_dict={k: v for k, v in model.state_dict().items() if not k.startswith("value_head.")})
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    if getattr(model, "value_head", None) is not None:
        torch.save(model.value_head.state_dict(), os.path.join(directory, VALUE_HEAD_NAME))


def load_value_head(model: nn.Module, directory: str) -> None:
    path = os.path.join(directory, VALUE_HEAD_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing")
    model.value_head.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
