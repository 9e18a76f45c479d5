"""`MultiAgentModel`: the one `nn.Module` the Trainer sees, holding N agents (and optional critics)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import json

import safetensors.torch
import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from .value_head import load_value_head, save_with_value_head

CRITIC_LAYOUTS = (None, "per_agent", "central")


def agent_dir(root: str | os.PathLike, index: int) -> str:
    return os.path.join(os.fspath(root), f"agent_{index}")


class MultiAgentModel(nn.Module):
    """N causal-LM agents (plus optional critics) and one tokenizer per agent.

    It deliberately has no `.config`: the Trainer then skips single-model assumptions (`use_cache`, special-token
    alignment). Its on-disk layout (spec §4):

        agent_i/                 from_pretrained folder + tokenizer (+ value_head.pt when the actor has a head);
                                 LoRA agents: the adapter only (adapter_model.safetensors + adapter_config.json)
        agent_i/critic/          critic_layout="per_agent": agent i's critic backbone + value_head.pt
        critic/                  critic_layout="central": the one critic backbone + value_head.pt
    """

    def __init__(
        self,
        agents: Sequence[nn.Module],
        tokenizers: Sequence[PreTrainedTokenizerBase],
        critics: Sequence[nn.Module] | None = None,
        critic_layout: str | None = None,
    ):
        super().__init__()
        if len(agents) != len(tokenizers):
            raise ValueError(f"{len(agents)} agents but {len(tokenizers)} tokenizers")
        if critic_layout not in CRITIC_LAYOUTS or (critic_layout is None) != (not critics):
            raise ValueError(f"critic_layout {critic_layout!r} does not fit {len(critics or [])} critics")
        self.agents = nn.ModuleList(agents)
        self.critics = nn.ModuleList(critics) if critics else None
        self.critic_layout = critic_layout
        self.tokenizers = list(tokenizers)

    @property
    def num_agents(self) -> int:
        return len(self.agents)

    def forward(self, agent_idx: int, **kwargs):
        """Route a forward pass to one agent (one entry point keeps DDP wrapping possible)."""
        return self.agents[agent_idx](**kwargs)

    # Trainer enables checkpointing on `model` with either name depending on the transformers release.
    def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None, **kwargs):
        for agent in self.agents:
            if hasattr(agent, "activation_checkpointing_enable"):
                agent.activation_checkpointing_enable(activation_checkpointing_kwargs, **kwargs)
            else:
                agent.gradient_checkpointing_enable(gradient_checkpointing_kwargs=activation_checkpointing_kwargs)

    def activation_checkpointing_disable(self):
        for agent in self.agents:
            if hasattr(agent, "activation_checkpointing_disable"):
                agent.activation_checkpointing_disable()
            else:
                agent.gradient_checkpointing_disable()

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None, **kwargs):
        self.activation_checkpointing_enable(gradient_checkpointing_kwargs)

    def gradient_checkpointing_disable(self):
        self.activation_checkpointing_disable()

    def agent_parameters(self, index: int):
        return [p for p in self.agents[index].parameters() if p.requires_grad]

    def _critic_dirs(self, root: str | os.PathLike) -> list[tuple[str, int]]:
        """(folder, tokenizer index) of each critic."""
        if self.critic_layout == "per_agent":
            return [(os.path.join(agent_dir(root, i), "critic"), i) for i in range(len(self.critics))]
        if self.critic_layout == "central":
            return [(os.path.join(os.fspath(root), "critic"), 0)]
        return []

    def save_pretrained(self, save_directory: str | os.PathLike, agent_state_dicts: list[dict] | None = None) -> None:
        """Write the layout above; every backbone folder loads with `from_pretrained`. `agent_state_dicts`:
        the weights to write per agent instead of the live ones (FSDP's gathered full state dicts)."""
        for i, (agent, tokenizer) in enumerate(zip(self.agents, self.tokenizers)):
            state = agent_state_dicts[i] if agent_state_dicts is not None else None
            save_with_value_head(agent, agent_dir(save_directory, i), tokenizer, state_dict=state)
        for critic, (path, tok_index) in zip(self.critics or [], self._critic_dirs(save_directory)):
            save_with_value_head(critic, path, self.tokenizers[tok_index])

    def load_weights(self, directory: str | os.PathLike) -> None:
        """Load a saved layout into the live models, in place (same architectures required)."""
        for i, agent in enumerate(self.agents):
            _load_folder_into(agent, agent_dir(directory, i))
        for critic, (path, _) in zip(self.critics or [], self._critic_dirs(directory)):
            _load_folder_into(critic, path)


def _load_folder_into(model: nn.Module, folder: str) -> None:
    from .peft_agents import is_peft_model, load_adapter_folder

    if is_peft_model(model):  # LoRA agents and critics are saved (and restored) as adapters
        load_adapter_folder(model, folder)
        if getattr(model, "value_head", None) is not None:
            load_value_head(model, folder)
        return
    model.load_state_dict(read_folder_state(model, folder), strict=False)
    if getattr(model, "value_head", None) is not None:
        load_value_head(model, folder)


def read_folder_state(model: nn.Module, folder: str) -> dict[str, torch.Tensor]:
    """The safetensors weights of a saved full (non-LoRA) model folder, checked to fit `model`."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    state: dict[str, torch.Tensor] = {}
    for name in files:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path} is missing")
        state.update(safetensors.torch.load_file(path))
    # tied aliases are listed once by named_parameters; the head comes from value_head.pt
    required = {n for n, _ in model.named_parameters() if not n.startswith("value_head.")}
    missing, unexpected = required - state.keys(), state.keys() - set(model.state_dict())
    if missing or unexpected:
        raise ValueError(f"{folder} does not fit {type(model).__name__}: missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
    return state
