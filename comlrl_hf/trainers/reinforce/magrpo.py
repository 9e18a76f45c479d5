"""MAGRPO: every agent samples K completions per prompt; the joint reward of each aligned joint action,
minus a group baseline, is every agent's advantage (Multi-Agent Group Relative Policy Optimization)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...rollout.multiturn import TurnRollout, credit_to_agents, discounted_returns, joint_actions
from ...utils.advantages import group_advantages
from ..base import MultiAgentTrainer
from .config import MAGRPOConfig, MAREINFORCEConfig, MAReMaxConfig, MARLOOConfig


@dataclass
class JointRollout:
    turns: list[TurnRollout]  # turn t: every node of the batch's trees at depth t


class MAGRPOTrainer(MultiAgentTrainer):
    """Train N cooperating agents with group-relative joint rewards.

    Example (tiny local models; any hub id or directory works the same way):

    ```python
    >>> from datasets import Dataset
    >>> from comlrl_hf.testing import save_tiny_model
    >>> from comlrl_hf.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
    >>> path = save_tiny_model("/tmp/tiny-qwen2", "qwen2")
    >>> def reward_func(completions1, completions2):
    ...     return [float(len(b) > len(a)) for a, b in zip(completions1, completions2)]
    >>> trainer = MAGRPOTrainer(
    ...     agent_model=path, num_agents=2, reward_func=reward_func,
    ...     train_dataset=Dataset.from_dict({"prompt": ["Describe a city:", "Design a park:"]}),
    ...     args=MAGRPOConfig(output_dir="/tmp/magrpo", num_train_epochs=1, max_new_tokens=8, report_to=[]),
    ... )
    >>> trainer.train()  # doctest: +SKIP
    ```

    Args:
        agent_model: a hub id or local directory for N homogeneous agents.
        agents: a list of ids, directories or loaded models, one per agent (heterogeneous).
        num_agents: the agent count; must agree with `args.num_agents` and `len(agents)` when those are set.
        tokenizer: one tokenizer for all agents or a list, one per agent. Loaded from ids/directories if None.
        reward_func: `reward_func(completions_agent_0, ..., completions_agent_{N-1})` -> one float per joint
            action; it may also declare `prompts=` and `batch_items=` (the dataset rows).
        reward_processor: float -> float applied to each reward.
        formatters: `item -> prompt` (text or chat messages), one callable or a list per agent.
        external_transition: with `num_turns > 1`, maps a joint action to the next per-agent prompts
            (see docs/multi_turn.md).
        peft_config: a `peft.LoraConfig` for every agent, or a list (one per agent): LoRA agents. Homogeneous
            agents then share one frozen base with one adapter each (see docs/peft_and_hub.md).
        peft_backend: "shared" (one base, named adapters) or "separate" (one PeftModel per agent); None picks.
        eval_logger / eval_aggregator: as in comlrl: `eval_logger(agent_completions_turns=, batch_items=,
            prompts=) -> list[dict]`, `eval_aggregator(metrics, num_turns=) -> dict`, logged as `eval_<key>`.
    """

    config_class = MAGRPOConfig
    algorithm_name = "MAGRPO"
    supports_data_parallel = True  # tests/test_ddp.py
    supports_fully_sharded = True  # tests/test_fsdp.py

    def rollout(self, batch: list[dict]) -> JointRollout:
        """Grow each prompt's tree, then give every node's K completions per agent their group advantages."""
        args, K = self.args, self.args.num_generations
        turns = self._roll_out(batch, K, args.joint_mode, args.early_termination_threshold, do_sample=True)
        returns = discounted_returns([t.rewards for t in turns], [t.children for t in turns], args.discount)
        actions = joint_actions(K, self.num_agents, args.joint_mode)
        for turn, G in zip(turns, returns):
            credit = torch.stack([credit_to_agents(g, actions, K) for g in G])  # [nodes, N, K]
            turn.advantages = [  # computed on the rollout's device, used on agent i's (agent_devices)
                group_advantages(credit[:, i], args.advantage_mode, args.scale_rewards).reshape(-1).to(self.agent_device(i))
                for i in range(self.num_agents)
            ]
        self.finish_rollout(turns, returns, actions)
        return JointRollout(turns)

    def agent_loss(self, agent_index: int, inputs: JointRollout) -> torch.Tensor:
        return self.policy_loss_over_turns(agent_index, inputs.turns)


class MAREINFORCETrainer(MAGRPOTrainer):
    """MAGRPO with `MAREINFORCEConfig`: raw joint rewards as advantages."""

    config_class = MAREINFORCEConfig
    algorithm_name = "MAREINFORCE"


class MARLOOTrainer(MAGRPOTrainer):
    """MAGRPO with `MARLOOConfig`: leave-one-out baseline."""

    config_class = MARLOOConfig
    algorithm_name = "MARLOO"


class MAReMaxTrainer(MAGRPOTrainer):
    """MAGRPO with `MAReMaxConfig`: the group's best reward as baseline."""

    config_class = MAReMaxConfig
    algorithm_name = "MAReMax"
