"""MAAC: multi-agent actor-critic with one centralized critic over the joint input (spec §2.1)."""

from __future__ import annotations

import torch

from ...models.value_head import token_values
from ...utils.prompts import prompt_text
from ...rollout.multiturn import TurnRollout
from ...utils.model_sources import resolve_sources
from .base import ActorCriticRollout, ActorCriticTrainer
from .config import MAACConfig


class MAACTrainer(ActorCriticTrainer):
    """Multi-agent actor-critic: one critic (`critic_model` or a one-element `critics`) values the joint input,
    encoded with the *first* actor's tokenizer: `"[Agent i] <prompt i>"` blocks, plus, for `critic_type="q"`,
    `"[Joint Action]"` and `"[Agent i action]\\n<completion i>"` blocks. Its value loss is applied once per
    step (the original stepped the shared critic once per agent). Saved as `critic/` + `value_head.pt`.
    A hidden layer in its head: `model_config={"critic_value_head_hidden_dim": ...}`.

    ```python
    >>> trainer = MAACTrainer(
    ...     agent_model=None, agents=[actor_a, actor_b], tokenizer=[tok_a, tok_b], critic_model=critic_dir,
    ...     critics=None, reward_func=reward_func, train_dataset=train_dataset,
    ...     args=MAACConfig(num_agents=2, num_turns=1))  # doctest: +SKIP
    ```
    """

    config_class = MAACConfig
    algorithm_name = "MAAC"

    def _critic_sources(self, args: MAACConfig, num_agents: int) -> list:
        critic_model, critics = self._critic_args
        if critic_model is None and critics is None:
            raise ValueError("either critic_model or critics (one element) must be provided for MAAC")
        return resolve_sources("critics", critic_model, critics, 1)

    def _build_critics(self, agents, tokenizers, args):
        hidden = self.model_config.get("critic_value_head_hidden_dim")
        critic = self._load_critic(self._resolved_critics[0], tokenizers[0], "the centralized critic (with agent 0's tokenizer)", hidden, seed=args.seed)
        if any(critic is a for a in agents):
            raise ValueError("the centralized critic must be its own model object, not one of the agents")
        return [critic], "central"

    def _joint_texts(self, turn: TurnRollout) -> list[str]:
        K, texts = self.args.num_generations, []
        for n in range(turn.rewards.shape[0]):
            state = "\n\n".join(f"[Agent {i}] {prompt_text(turn.prompts[i][n])}" for i in range(self.num_agents))
            for k in range(K):
                if self.args.critic_type == "q":
                    actions = "\n\n".join(
                        f"[Agent {i} action]\n{turn.agents[i].completions[n * K + k]}" for i in range(self.num_agents)
                    )
                    texts.append(f"{state}\n\n[Joint Action]\n{actions}")
                else:
                    texts.append(state)
        return texts

    def row_values(self, turn: TurnRollout, agent_index: int) -> torch.Tensor:
        """The joint value of each row; the same for every agent (computed once per turn and reused)."""
        cache = getattr(turn, "_joint_values", None)
        if cache is not None and not torch.is_grad_enabled():
            return cache
        encoded = self.tokenizers[0](self._joint_texts(turn), return_tensors="pt", padding=True, padding_side="right")
        encoded = encoded.to(self.critic_device(0))  # the joint input goes where the critic is
        values = token_values(self.critics[0], encoded["input_ids"], encoded["attention_mask"])
        last = encoded["attention_mask"].sum(dim=1) - 1
        values = values.gather(1, last.unsqueeze(1)).squeeze(1)
        if not torch.is_grad_enabled():
            turn._joint_values = values
        return values

    def agent_loss(self, agent_index: int, inputs: ActorCriticRollout) -> torch.Tensor:
        return self.policy_loss_over_turns(agent_index, inputs.turns)

    def shared_losses(self, inputs: ActorCriticRollout) -> dict[str, torch.Tensor]:
        value = self.critic_value_loss(inputs, 0)
        self.record_metric("critic/value_loss", value.detach())
        return {"the centralized critic": self.args.value_loss_coef * value}
