"""LoRA agents for every trainer: `peft_config=` (one `peft.LoraConfig` or one per agent) and `peft_backend=`.

Mixed into `MultiAgentTrainer`. With a `peft_config`, homogeneous agents (one model id or directory for all)
default to one frozen base with adapters `agent_0..agent_{N-1}` (`peft_backend="shared"`): the base is
loaded once, all agents generate in one `generate(adapter_names=...)` call, and the KL reference is that base
with adapters disabled. Otherwise (`peft_backend="separate"`, or heterogeneous agents) each agent is its own
`PeftModel`. Either way `trainer.agents[i]` is agent i's causal LM and saves as a PEFT adapter folder.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from ..models.multi_agent import agent_dir
from ..models.peft_agents import (
    AdapterAgent,
    build_shared,
    check_not_already_peft,
    choose_backend,
    merged_copy,
    reference_for,
    resolve_peft_configs,
    wrap_separate,
)
from ..models.value_head import save_with_value_head
from ..rollout.generation import generate_completions_with_adapters
from ..utils.model_sources import load_causal_lm
from ..utils.seeding import seeded_stream


class PeftMixin:
    """See the module docstring. Expects `self._peft_args = (peft_config, peft_backend)` before loading."""

    peft_backend: str | None = None

    def _load_agent_models(self, sources: Sequence, tokenizers: Sequence, seed: int) -> list[torch.nn.Module]:
        """Load (and wrap in LoRA) every agent. Every PEFT mistake raises before any weights are loaded."""
        peft_config, requested = getattr(self, "_peft_args", (None, None))
        configs = resolve_peft_configs(peft_config, len(sources))
        backend = choose_backend(requested, sources, tokenizers, configs is not None)
        self.peft_backend = backend
        self._check_shared_base_placement(backend)  # one base cannot sit on two devices: refuse before loading
        if backend is None:
            return [load_causal_lm(src, self.model_config) for src in sources]
        check_not_already_peft(sources)
        if backend == "shared":
            base = load_causal_lm(sources[0], self.model_config)
            with seeded_stream(seed):  # LoRA's random init depends on the seed only (runs and resumes agree)
                return build_shared(base, configs)
        models = [load_causal_lm(src, self.model_config) for src in sources]
        with seeded_stream(seed):
            return [wrap_separate(model, cfg) for model, cfg in zip(models, configs)]

    def _reference_models(self) -> list[torch.nn.Module]:
        """The KL reference per agent: LoRA agents use their base with adapters off (one object for a shared
        base, never a copy); full fine-tuning keeps a frozen copy of each initial agent."""
        return reference_for(list(self.agents)) or [self._frozen_copy(a) for a in self.agents]

    def _generate_all_agents(self, do_sample: bool):
        """One `generate` call for all agents on a shared base (None: one call per agent)."""
        agents = list(self.agents)
        if self.peft_backend != "shared" or not all(isinstance(a, AdapterAgent) for a in agents):
            return None
        tokenizer = self.tokenizers[0]
        if any(t is not tokenizer for t in self.tokenizers):
            return None
        if any(cfg.use_dora for cfg in agents[0].peft_model.peft_config.values()):
            return None  # PEFT cannot mix DoRA adapters in one batch: one call per agent instead
        kwargs = self.args.generation_kwargs(do_sample=do_sample)
        names = [a.adapter_name for a in agents]
        return lambda prompts, k: generate_completions_with_adapters(
            agents[0].peft_model, tokenizer, prompts, names, k, kwargs
        )

    def peft_fingerprint(self) -> dict | None:
        """What a resume must match beyond parameter shapes: the backend and each adapter's LoRA settings."""
        from ..models.peft_agents import adapter_settings

        models = list(self.agents) + list(self._container.critics or [])
        settings = [adapter_settings(m) for m in models]
        return None if all(s is None for s in settings) else {"backend": self.peft_backend, "adapters": settings}

    def save_merged_model(self, output_dir: str | os.PathLike) -> None:
        """Write every agent (and critic) with its adapter merged into full weights: `agent_i/` is then a plain
        `from_pretrained` folder that needs no PEFT (value heads stay `value_head.pt`). Live models are untouched."""
        container = self._container
        output_dir = os.fspath(output_dir)
        for i, (agent, tokenizer) in enumerate(zip(container.agents, container.tokenizers)):
            save_with_value_head(_merged_or_same(agent), agent_dir(output_dir, i), tokenizer)
        for critic, (path, tok_index) in zip(container.critics or [], container._critic_dirs(output_dir)):
            save_with_value_head(_merged_or_same(critic), path, container.tokenizers[tok_index])


def _merged_or_same(model: torch.nn.Module) -> torch.nn.Module:
    from ..models.peft_agents import is_peft_model

    return merged_copy(model) if is_peft_model(model) else model
