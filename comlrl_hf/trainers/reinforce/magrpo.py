"""MAGRPO: every agent samples K completions per prompt; the joint reward of each aligned joint action,
minus a group baseline, is every agent's advantage (Multi-Agent Group Relative Policy Optimization)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from ...rollout.generation import AgentRollout, generate_completions
from ...rollout.rewards import JointRewardCaller
from ...utils.advantages import group_advantages
from ...utils.logprobs import completion_logps
from ...utils.losses import masked_mean, policy_loss
from ..base import MultiAgentTrainer
from .config import MAGRPOConfig, MAREINFORCEConfig, MAReMaxConfig, MARLOOConfig


@dataclass
class JointRollout:
    agents: list[AgentRollout]  # one per agent, rows aligned: row j of every agent is joint action j
    rewards: torch.Tensor  # [B * K] joint rewards
    advantages: torch.Tensor  # [B * K], shared by all agents
    prompts: list[Any]  # the dataset prompt of each row


def build_formatters(formatters, num_agents: int) -> list[Callable]:
    """None -> `item["prompt"]`; one callable -> every agent; a list -> one per agent."""
    if formatters is None:
        return [_default_formatter] * num_agents
    if callable(formatters):
        return [formatters] * num_agents
    if isinstance(formatters, Sequence) and not isinstance(formatters, str):
        if len(formatters) != num_agents:
            raise ValueError(f"formatters has {len(formatters)} entries but there are {num_agents} agents")
        for i, f in enumerate(formatters):
            if not callable(f):
                raise ValueError(f"formatters[{i}] must be callable, got {type(f).__name__}")
        return list(formatters)
    raise ValueError(f"formatters must be a callable or a list of {num_agents} callables, got {type(formatters).__name__}")


def _default_formatter(item: dict) -> Any:
    if not isinstance(item, dict) or "prompt" not in item:
        raise ValueError(f"dataset items need a 'prompt' field (or pass formatters=), got {item!r:.120}")
    return item["prompt"]


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
        eval_logger / eval_aggregator: as in comlrl: `eval_logger(agent_completions_turns=, batch_items=,
            prompts=) -> list[dict]`, `eval_aggregator(metrics, num_turns=) -> dict`, logged as `eval_<key>`.
    """

    config_class = MAGRPOConfig
    algorithm_name = "MAGRPO"

    def __init__(
        self,
        agent_model=None,
        agents=None,
        num_agents: int | None = None,
        tokenizer=None,
        model_config: dict | None = None,
        train_dataset=None,
        eval_dataset=None,
        reward_func: Callable | None = None,
        reward_processor: Callable | None = None,
        formatters=None,
        external_transition: Callable | None = None,
        wandb_config: dict | None = None,
        eval_logger: Callable | None = None,
        eval_aggregator: Callable | None = None,
        args: MAGRPOConfig | None = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
    ):
        self._user_callables = dict(
            reward_func=reward_func, reward_processor=reward_processor, formatters=formatters,
            external_transition=external_transition, eval_logger=eval_logger, eval_aggregator=eval_aggregator,
        )
        super().__init__(
            agent_model=agent_model, agents=agents, num_agents=num_agents, tokenizer=tokenizer,
            model_config=model_config, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset,
            callbacks=callbacks, optimizers=optimizers, wandb_config=wandb_config,
        )
        # A frozen copy of each initial agent, only when the KL term is on.
        self.ref_agents = [self._frozen_copy(a) for a in self.agents] if self.args.beta > 0 else None
        self._last_samples: list[dict] = []

    def _validate_before_loading(self, args: MAGRPOConfig, num_agents: int) -> None:
        c = self._user_callables
        self.reward_caller = JointRewardCaller(c["reward_func"], num_agents, c["reward_processor"])
        self.formatters = build_formatters(c["formatters"], num_agents)
        if args.num_turns > 1:
            if c["external_transition"] is None:
                raise ValueError(f"num_turns={args.num_turns} needs an external_transition (multi-turn episodes)")
            raise NotImplementedError("multi-turn MAGRPO (num_turns > 1) is not implemented yet")
        for name in ("eval_logger", "eval_aggregator", "external_transition"):
            if c[name] is not None and not callable(c[name]):
                raise ValueError(f"{name} must be callable, got {type(c[name]).__name__}")
        self.eval_logger, self.eval_aggregator = c["eval_logger"], c["eval_aggregator"]

    @staticmethod
    def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
        ref = copy.deepcopy(model).eval()
        ref.requires_grad_(False)
        return ref

    def rollout_reuse_count(self) -> int:
        return self.args.num_iterations

    # ---- rollout: generate, score, advantages ----
    def _generate(self, batch: list[dict], num_generations: int, do_sample: bool) -> list[AgentRollout]:
        kwargs = self.args.generation_kwargs(do_sample=do_sample)
        return [
            generate_completions(agent, tok, [fmt(item) for item in batch], num_generations, kwargs)
            for agent, tok, fmt in zip(self.agents, self.tokenizers, self.formatters)
        ]

    def _score(self, batch: list[dict], rollouts: list[AgentRollout], num_generations: int) -> tuple[list, list[float]]:
        items = [item for item in batch for _ in range(num_generations)]
        prompts = [item.get("prompt") if isinstance(item, dict) else None for item in items]
        rewards = self.reward_caller(
            [r.completions for r in rollouts], prompts=prompts, batch_items=items, step=self.state.global_step
        )
        return prompts, rewards

    def rollout(self, batch: list[dict]) -> JointRollout:
        K = self.args.num_generations
        rollouts = self._generate(batch, K, do_sample=True)
        prompts, rewards = self._score(batch, rollouts, K)
        R = torch.tensor(rewards, dtype=torch.float32, device=self.args.device)
        A = group_advantages(R.view(len(batch), K), self.args.advantage_mode, self.args.scale_rewards).view(-1)
        self.env_step += R.numel()
        with torch.no_grad():
            for i, r in enumerate(rollouts):
                if self.args.num_iterations > 1:  # the sampling policy's log-probs, for the clipped ratio
                    r.old_logps, _ = completion_logps(self._agent_forward(i), *self._tensors(r), temperature=self.args.temperature)
                if self.ref_agents is not None:
                    r.ref_logps, _ = completion_logps(self.ref_agents[i], *self._tensors(r), temperature=self.args.temperature)
                self.record_metric(f"agent_{i}/completion_length", r.completion_lengths.float().mean())
        self.record_metric("reward", R.mean())
        self.record_metric("reward_std", R.std() if R.numel() > 1 else 0.0)
        self._last_samples = [
            {"step": self.state.global_step, "prompt": p, "reward": rw, **{f"agent_{i}": r.completions[j] for i, r in enumerate(rollouts)}}
            for j, (p, rw) in enumerate(zip(prompts, rewards))
        ]
        return JointRollout(rollouts, R, A, prompts)

    # ---- loss ----
    def _agent_forward(self, agent_index: int):
        return partial(self.model_wrapped, agent_index)

    @staticmethod
    def _tensors(r: AgentRollout):
        return r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask

    def agent_loss(self, agent_index: int, inputs: JointRollout) -> torch.Tensor:
        r = inputs.agents[agent_index]
        logps, entropy = completion_logps(
            self._agent_forward(agent_index), *self._tensors(r), temperature=self.args.temperature, with_entropy=True
        )
        old_logps = r.old_logps if r.old_logps is not None else logps.detach()
        loss, stats = policy_loss(
            logps, old_logps, inputs.advantages, r.completion_mask,
            epsilon_low=self.args.epsilon, epsilon_high=self.args.epsilon_high, loss_type=self.args.loss_type,
            ref_logps=r.ref_logps, beta=self.args.beta, max_completion_length=self.args.max_new_tokens,
        )
        prefix = f"agent_{agent_index}"
        self.record_metric(f"{prefix}/loss", loss.detach())
        self.record_metric(f"{prefix}/entropy", masked_mean(entropy, r.completion_mask))
        for name, value in stats.items():
            self.record_metric(f"{prefix}/{name}", value)
        return loss

    # ---- logging and evaluation ----
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self.args.log_completions and self._last_samples:
            self._log_completions(self._last_samples[: self.args.num_completions_to_print])
        super().log(logs, start_time)

    def _log_completions(self, rows: list[dict]) -> None:
        if not self.is_world_process_zero():
            return
        for row in rows:
            print(" | ".join(f"{k}: {str(v)[:80]!r}" if isinstance(v, str) else f"{k}: {v}" for k, v in row.items()))
        if "wandb" in (self.args.report_to or []):
            import wandb

            if wandb.run is not None:
                columns = list(rows[0])
                wandb.log({"completions": wandb.Table(columns=columns, data=[[str(r[c]) for c in columns] for r in rows])})

    @torch.no_grad()
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """One completion per agent per prompt (greedy unless `eval_do_sample`), scored by `reward_func`."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("evaluate() needs an eval_dataset (constructor or argument)")
        items = [dataset[i] for i in range(len(dataset))]
        size = self.args.per_device_eval_batch_size
        rewards, completions, prompts = [], [[] for _ in range(self.num_agents)], []
        for start in range(0, len(items), size):
            batch = items[start : start + size]
            rollouts = self._generate(batch, 1, do_sample=self.args.eval_do_sample)
            batch_prompts, batch_rewards = self._score(batch, rollouts, 1)
            rewards += batch_rewards
            prompts += batch_prompts
            for i, r in enumerate(rollouts):
                completions[i] += r.completions
        R = torch.tensor(rewards)
        metrics = {f"{metric_key_prefix}_reward": R.mean().item(), f"{metric_key_prefix}_reward_std": R.std().item() if len(R) > 1 else 0.0}
        if self.eval_logger is not None and self.eval_aggregator is not None:
            turns = [[[c] for c in agent] for agent in completions]  # [agent][item][turn]
            logged = self.eval_logger(agent_completions_turns=turns, batch_items=items, prompts=prompts)
            for key, value in self.eval_aggregator(logged, num_turns=self.args.num_turns).items():
                metrics[f"{metric_key_prefix}_{key}"] = float(value)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics


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
