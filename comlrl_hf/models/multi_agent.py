"""`MultiAgentModel`: the one `nn.Module` the Trainer sees, holding N agents (and optional critics)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from torch import nn
from transformers import PreTrainedTokenizerBase


def agent_dir(root: str | os.PathLike, index: int) -> str:
    return os.path.join(os.fspath(root), f"agent_{index}")


class MultiAgentModel(nn.Module):
    """N causal-LM agents (plus optional critics) and one tokenizer per agent.

    It deliberately has no `.config`: the Trainer then skips single-model assumptions (`use_cache`, special-token
    alignment). Its on-disk layout is `agent_i/` (a complete `from_pretrained` directory with tokenizer files).
    """

    def __init__(
        self,
        agents: Sequence[nn.Module],
        tokenizers: Sequence[PreTrainedTokenizerBase],
        critics: Sequence[nn.Module] | None = None,
    ):
        super().__init__()
        if len(agents) != len(tokenizers):
            raise ValueError(f"{len(agents)} agents but {len(tokenizers)} tokenizers")
        self.agents = nn.ModuleList(agents)
        self.critics = nn.ModuleList(critics) if critics else None
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

    def save_pretrained(self, save_directory: str | os.PathLike, *, safe_serialization: bool = True) -> None:
        """Write `agent_i/` for every agent: HF config, safetensors weights, generation config, tokenizer."""
        for i, (agent, tokenizer) in enumerate(zip(self.agents, self.tokenizers)):
            path = agent_dir(save_directory, i)
            os.makedirs(path, exist_ok=True)
            agent.save_pretrained(path, safe_serialization=safe_serialization)
            tokenizer.save_pretrained(path)
