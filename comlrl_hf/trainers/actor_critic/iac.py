"""IAC: independent actor-critic, one critic per agent (spec §2.2)."""

from __future__ import annotations

import torch

from ...models.value_head import attach_value_head
from ...rollout.multiturn import TurnRollout
from ...utils.model_sources import resolve_sources
from .base import ActorCriticRollout, ActorCriticTrainer
from .config import IACConfig


class IACTrainer(ActorCriticTrainer):
    """Independent actor-critic: agent i's critic values agent i's own tokens.

    - `IACConfig(use_separate_critic=True)`: `critic_model` (one id, loaded once per agent) or `critics`
      (one per agent); critic i reads agent i's token ids, so it must fit agent i's tokenizer. Saved as
      `agent_i/critic/` + `value_head.pt`.
    - `IACConfig(use_separate_critic=False)`: a value head on each actor's own backbone (`agents[i].value_head`),
      saved as `agent_i/value_head.pt`; `critic_model` and `critics` must be None.

    ```python
    >>> trainer = IACTrainer(
    ...     agent_model=None, agents=[actor_a, actor_b], tokenizer=[tok_a, tok_b],
    ...     critic_model=None, critics=[actor_a, actor_b], reward_func=reward_func, train_dataset=train_dataset,
    ...     args=IACConfig(num_agents=2, num_turns=1, use_separate_critic=True))  # doctest: +SKIP
    ```
    """

    config_class = IACConfig
    algorithm_name = "IAC"

    def _critic_sources(self, args: IACConfig, num_agents: int) -> list | None:
        critic_model, critics = self._critic_args
        if not args.use_separate_critic:
            if critic_model is not None or critics is not None:
                raise ValueError(
                    "critic_model and critics must be None when use_separate_critic=False (the value head sits on "
                    f"each actor); got critic_model={critic_model!r}, critics={critics!r}"
                )
            return None
        if critic_model is None and critics is None:
            raise ValueError("either critic_model or critics must be provided when use_separate_critic=True")
        return resolve_sources("critics", critic_model, critics, num_agents)

    def _build_critics(self, agents, tokenizers, args):
        if self._resolved_critics is None:
            for i, agent in enumerate(agents):
                attach_value_head(agent, args.value_head_hidden_dim, seed=args.seed + i)
            return None, None
        critics = [
            self._load_critic(src, tokenizers[i], f"critics[{i}] (with agent {i}'s tokenizer)",
                              args.critic_value_head_hidden_dim, seed=args.seed + i, index=i)
            for i, src in enumerate(self._resolved_critics)
        ]
        if len({id(c) for c in critics}) < len(critics) or any(id(c) in {id(a) for a in agents} for c in critics):
            raise ValueError("each critic must be its own model object (not shared with another critic or an agent)")
        return critics, "per_agent"

    def default_critic_devices(self, args, count: int) -> list:
        """Critic i with agent i."""
        return list(self._agent_devices)

    def row_values(self, turn: TurnRollout, agent_index: int) -> torch.Tensor:
        model = self.agents[agent_index] if self.critics is None else self.critics[agent_index]
        return self._state_or_action_values(model, turn.agents[agent_index], self.args.critic_type)

    def agent_loss(self, agent_index: int, inputs: ActorCriticRollout) -> torch.Tensor:
        policy = self.policy_loss_over_turns(agent_index, inputs.turns)
        value = self.critic_value_loss(inputs, agent_index)
        self.record_metric(f"agent_{agent_index}/value_loss", value.detach())
        return policy + self.args.value_loss_coef * value.to(policy.device)  # critic i may sit elsewhere
