"""Episodes shared by every trainer: formatting, batched generation, joint rewards, transitions, the
clipped policy loss over turns, the sample table and evaluation. Algorithms only add their advantages
(and critics)."""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch

from ..rollout.generation import AgentRollout, generate_completions
from ..rollout.multiturn import TransitionCaller, TurnRollout, roll_out_tree
from ..rollout.rewards import JointRewardCaller
from ..rollout.seeded import generate_per_prompt, prompt_seed
from ..utils.logprobs import completion_logps
from ..utils.losses import masked_mean, policy_loss


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


class EpisodeMixin:
    """Mixed into `MultiAgentTrainer`; expects `self._user_callables` (reward_func, reward_processor,
    formatters, external_transition, eval_logger, eval_aggregator)."""

    def _setup_episodes(self, args, num_agents: int) -> None:
        """Check and wrap the user's callables (before any model is loaded)."""
        c = self._user_callables
        self.reward_caller = JointRewardCaller(c["reward_func"], num_agents, c["reward_processor"])
        self.formatters = build_formatters(c["formatters"], num_agents)
        self.transition_caller = None
        if args.num_turns > 1:
            if c["external_transition"] is None:
                raise ValueError(f"num_turns={args.num_turns} needs an external_transition (multi-turn episodes)")
            self.transition_caller = TransitionCaller(c["external_transition"], num_agents)
        args.check_tree_size(num_agents)
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
        return self.args.num_ppo_epochs

    # ---- generation and scoring ----
    def _generate_for(self, agent_index: int, prompts: list, num_generations: int, do_sample: bool = True) -> AgentRollout:
        indices = getattr(self, "_prompt_indices", None)  # set during training with seed_generation_per_prompt
        with self.gathered_for_generation(agent_index):  # FSDP: the agent's full weights while it decodes
            if do_sample and indices is not None:
                # a stage that samples outside the RL steps (MARLHF's pairs) sets its own prefix
                prefix = getattr(self, "_prompt_seed_prefix", None) or (self.args.seed, self.state.global_step)
                seeds = [prompt_seed(*prefix, index, agent_index) for index in indices]
                return generate_per_prompt(
                    self.agents[agent_index], self.tokenizers[agent_index], prompts, num_generations,
                    self.args.generation_kwargs(do_sample=True), seeds,
                )
            return generate_completions(
                self.agents[agent_index], self.tokenizers[agent_index], prompts, num_generations,
                self.args.generation_kwargs(do_sample=do_sample),
            )

    def _score(self, completions: list[list[str]], items: list) -> list[float]:
        prompts = [item.get("prompt") if isinstance(item, dict) else None for item in items]
        return self.reward_caller(completions, prompts=prompts, batch_items=items, step=self.state.global_step)

    def _roll_out(self, batch: list[dict], num_generations: int, joint_mode: str, threshold, do_sample: bool):
        return roll_out_tree(
            batch,
            generate=lambda i, prompts, k: self._generate_for(i, prompts, k, do_sample),
            generate_all=None if getattr(self, "_prompt_indices", None) is not None else self._generate_all_agents(do_sample),
            formatters=self.formatters, score=self._score, transition=self.transition_caller,
            num_generations=num_generations, num_turns=self.args.num_turns, joint_mode=joint_mode,
            early_termination_threshold=threshold, external_prompt_passthrough=self.args.external_prompt_passthrough,
        )


    def finish_rollout(self, turns: list[TurnRollout], returns: list[torch.Tensor], actions) -> None:
        """What every algorithm does once its advantages are set: count env steps, attach the sampling and
        reference log-probs, and record the rollout's metrics and sample rows."""
        for t, (turn, G) in enumerate(zip(turns, returns)):
            self.env_step += turn.rewards.numel()
            if self.args.num_turns > 1:
                self.record_metric(f"turn_{t + 1}/reward_mean", turn.rewards.mean())
                self.record_metric(f"turn_{t + 1}/expected_return", G.mean())
        self.attach_sampling_logps(turns)
        first = turns[0].rewards
        self.record_metric("reward", first.mean())
        self.record_metric("reward_std", first.std() if first.numel() > 1 else 0.0)
        for i in range(len(turns[0].agents)):
            lengths = torch.cat([turn.agents[i].completion_lengths.float() for turn in turns])
            self.record_metric(f"agent_{i}/completion_length", lengths.mean())
        self._last_samples = self._sample_rows(turns[0], actions)

    def attach_sampling_logps(self, turns: list[TurnRollout]) -> None:
        """Log-probs of the sampling policy (ratio clipping) and of the reference (KL), when needed."""
        with torch.no_grad():
            for turn in turns:
                for i, r in enumerate(turn.agents):
                    if self.args.num_ppo_epochs > 1:
                        r.old_logps, _ = self._logps(i, r)
                    if self.ref_agents is not None:
                        r.ref_logps, _ = self._logps(i, r, model=self.ref_agents[i])

    # ---- loss ----
    def _logps(self, agent_index: int, r: AgentRollout, model=None, with_entropy: bool = False):
        """Per-token log-probs of agent `agent_index`'s rows under its policy (or `model`, e.g. the reference)."""
        agent = self.agents[agent_index]
        cache = self.__dict__.setdefault("_keeps_logits", {})
        if agent_index not in cache:  # models whose forward takes `logits_to_keep` skip the prompt's LM-head work
            cache[agent_index] = "logits_to_keep" in inspect.signature(agent.forward).parameters
        return completion_logps(
            model if model is not None else self._agent_forward(agent_index), *self._tensors(r),
            temperature=self.args.temperature, with_entropy=with_entropy,
            keep_logits_only_for_completion=cache[agent_index],
        )

    def _agent_forward(self, agent_index: int):
        return partial(self.model_wrapped, agent_index)

    @staticmethod
    def _tensors(r: AgentRollout):
        return r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask

    def policy_loss_over_turns(self, agent_index: int, turns: list[TurnRollout]) -> torch.Tensor:
        """The clipped policy-gradient loss over every turn's rows, each turn weighted by its share of the
        rows (tokens for `loss_type="dapo"`), so one turn of many nodes counts as much as it holds.

        With `loss_chunk_size`, rows go through forward+backward in chunks of that many (each weighted by its
        share, which gives the same gradient: every loss type is a weighted mean over rows or tokens), so the
        policy loss's activations stay bounded however many rows a step generated. The chunks' gradients are then
        already accumulated, and the returned loss carries no graph. (Reference/old log-probs and critic values
        still run over all rows, without gradients for the former.)"""
        args = self.args
        pieces = []  # (turn, rows of that turn)
        for turn in turns:
            rows = turn.agents[agent_index].completion_ids.shape[0]
            size = args.loss_chunk_size or rows
            pieces += [(turn, slice(start, min(start + size, rows))) for start in range(0, rows, size)]
        masks = [turn.agents[agent_index].completion_mask[rows] for turn, rows in pieces]
        weights = [float(m.sum()) if args.loss_type == "dapo" else float(m.shape[0]) for m in masks]
        total = sum(weights)
        backward = getattr(self, "_chunk_backward", None) if len(pieces) > len(turns) else None
        key = f"policy_{agent_index}"
        share = self._scale_for_ranks(torch.ones(()), total, key) if backward is not None else None
        losses, diagnostics = [], {}
        for (turn, rows), mask, weight in zip(pieces, masks, weights):
            r = turn.agents[agent_index]
            if rows.stop - rows.start < r.completion_ids.shape[0]:
                r = _row_slice(r, rows)
            logps, entropy = self._logps(agent_index, r, with_entropy=True)
            old_logps = r.old_logps if r.old_logps is not None else logps.detach()
            loss, stats = policy_loss(
                logps, old_logps, turn.advantages[agent_index][rows], mask,
                epsilon_low=args.epsilon, epsilon_high=args.epsilon_high, loss_type=args.loss_type,
                ref_logps=r.ref_logps, beta=args.beta, max_completion_length=args.max_new_tokens,
            )
            if backward is not None:  # free this chunk's activations now
                if not torch.isfinite(loss):
                    raise FloatingPointError(
                        f"agent {agent_index} produced a non-finite loss ({loss.item()}) at step {self.state.global_step}"
                    )
                backward(weight / total * share.to(loss.device) * loss)
                loss = loss.detach()
                self._policy_loss_streamed = True
            losses.append(loss)
            stats["entropy"] = masked_mean(entropy, mask)
            for name, value in stats.items():
                diagnostics.setdefault(name, []).append(value)
        loss = sum(w / total * l for w, l in zip(weights, losses))
        loss = self._scale_for_ranks(loss, total, key) if backward is None else loss * share.to(loss.device)
        prefix = f"agent_{agent_index}"
        self.record_metric(f"{prefix}/loss", loss.detach())
        for name, values in diagnostics.items():
            self.record_metric(f"{prefix}/{name}", sum(w / total * v for w, v in zip(weights, values)))
        return loss

    def _policy_weight(self, agent_index: int, turns: list[TurnRollout]) -> float:
        """The rows (tokens for `dapo`) agent `agent_index`'s policy loss averages over: its `_scale_for_ranks`
        weight."""
        masks = [turn.agents[agent_index].completion_mask for turn in turns]
        return sum(float(m.sum()) if self.args.loss_type == "dapo" else float(m.shape[0]) for m in masks)

    def _sample_rows(self, turn: TurnRollout, actions) -> list[dict]:
        K, rows = self.args.num_generations, []
        for j, item in enumerate(turn.items):
            node, a = divmod(j, len(actions))
            row = {"step": self.state.global_step, "prompt": item.get("prompt") if isinstance(item, dict) else item}
            row.update({f"agent_{i}": r.completions[node * K + actions[a][i]] for i, r in enumerate(turn.agents)})
            row["reward"] = turn.rewards[node, a].item()
            rows.append(row)
        return rows

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
        if self.wandb_identity is not None:  # our W&B callback opened (or joined) a run
            import wandb

            columns = list(rows[0])
            table = wandb.Table(columns=columns, data=[[str(r[c]) for c in columns] for r in rows])
            wandb.log({"completions": table, "env_step": self.env_step}, step=self.env_step)

    @torch.no_grad()
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """One completion per agent per prompt (greedy unless `eval_do_sample`), scored by `reward_func`."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("evaluate() needs an eval_dataset (constructor or argument)")
        items = [dataset[i] for i in range(len(dataset))]
        size, T = self.args.per_device_eval_batch_size, self.args.num_turns
        completions = [[[] for _ in items] for _ in range(self.num_agents)]  # [agent][item][turn]
        rewards = [[] for _ in range(T)]  # per turn, one per item (items whose episode ended are absent)
        for start in range(0, len(items), size):
            batch = items[start : start + size]
            turns = self._roll_out(batch, 1, "aligned", None, do_sample=self.args.eval_do_sample)
            for t, turn in enumerate(turns):  # one completion per agent: each node is one item's single path
                rewards[t] += turn.rewards.view(-1).tolist()
                for i, r in enumerate(turn.agents):
                    for n, text in enumerate(r.completions):
                        completions[i][start + n].append(text)
        first = torch.tensor(rewards[0])
        metrics = {
            f"{metric_key_prefix}_reward": first.mean().item(),
            f"{metric_key_prefix}_reward_std": first.std().item() if len(first) > 1 else 0.0,
        }
        if T > 1:
            for t in range(T):
                to_go = sum(self.args.discount ** (u - t) * torch.tensor(rewards[u]).mean().item() for u in range(t, T))
                metrics[f"{metric_key_prefix}_turn_{t + 1}/reward_mean"] = torch.tensor(rewards[t]).mean().item()
                metrics[f"{metric_key_prefix}_turn_{t + 1}/expected_return"] = to_go
        if self.eval_logger is not None and self.eval_aggregator is not None:
            prompts = [item.get("prompt") if isinstance(item, dict) else None for item in items]
            logged = self.eval_logger(agent_completions_turns=completions, batch_items=items, prompts=prompts)
            for key, value in self.eval_aggregator(logged, num_turns=T).items():
                metrics[f"{metric_key_prefix}_{key}"] = float(value)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics


def _row_slice(r: AgentRollout, rows: slice) -> AgentRollout:
    """Rows `rows` of one agent's rollout (every per-row tensor and text)."""
    optional = {name: getattr(r, name)[rows] if getattr(r, name) is not None else None for name in ("old_logps", "ref_logps")}
    return dataclasses.replace(
        r, prompt_ids=r.prompt_ids[rows], prompt_mask=r.prompt_mask[rows], completion_ids=r.completion_ids[rows],
        completion_mask=r.completion_mask[rows], completions=r.completions[rows], **optional,
    )
