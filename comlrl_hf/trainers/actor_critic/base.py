"""`ActorCriticTrainer`: rollouts scored by a learned critic (IAC and MAAC share everything but the critic).

Per turn t and row (a node's k-th joint action), with critic value V_t (state, or state-action for
`critic_type="q"`) and joint reward r_t, advantages are GAE over turns (`utils.advantages.tree_gae`):
    delta_t = r_t + gamma V_{t+1} - V_t,   A_t = delta_t + gamma lambda A_{t+1},   target_t = A_t + V_t.
The actor minimises the clipped policy loss with A (optionally z-scored per agent and turn); the critic
minimises (V - target)^2 (optionally clipped around the rollout's values), weighted by `value_loss_coef`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...models.peft_agents import check_not_already_peft, resolve_peft_configs, wrap_separate
from ...models.value_head import attach_value_head, token_values
from ...rollout.generation import AgentRollout
from ...rollout.multiturn import TurnRollout, discounted_returns
from ...utils.advantages import tree_gae
from ...utils.losses import value_loss
from ...utils.model_sources import check_vocab_fits, load_causal_lm
from ...utils.seeding import seeded_stream
from ..placement import resolve_devices
from ..base import MultiAgentTrainer
from .config import ActorCriticConfig


@dataclass
class ActorCriticRollout:
    turns: list[TurnRollout]
    value_targets: list[list[torch.Tensor]]  # [turn][agent] -> [rows]
    old_values: list[list[torch.Tensor]]  # [turn][agent] -> [rows], the values at rollout time


class ActorCriticTrainer(MultiAgentTrainer):
    """Base of [`IACTrainer`] and [`MAACTrainer`]; takes `critic_model` / `critics` besides the agents."""

    config_class = ActorCriticConfig
    explicit_tokenizer_for_agent_list = True  # spec §1.3: AC trainers need a tokenizer when `agents` is given
    supports_data_parallel = True  # tests/test_ddp.py: IAC (separate and shared critics) and MAAC

    def __init__(self, *args, critic_model=None, critics=None, critic_peft_config=None, **kwargs):
        """`critic_peft_config`: one `peft.LoraConfig` for every separate critic, or one per critic; each critic
        becomes its own `PeftModel` (its value head stays fully trainable)."""
        self._critic_args = (critic_model, critics)
        self._critic_peft_config = critic_peft_config
        super().__init__(*args, **kwargs)

    @property
    def critics(self):
        return self._container.critics

    # ---- critics ----
    def _critic_sources(self, args, num_agents: int) -> list | None:
        """Where each critic comes from (None: value heads on the actors); checked before loading."""
        raise NotImplementedError

    def _validate_before_loading(self, args, num_agents: int) -> None:
        self._resolved_critics = self._critic_sources(args, num_agents)
        self._resolve_critic_placement(args)
        self._critic_peft_configs = None
        if self._critic_peft_config is not None:
            if self._resolved_critics is None:
                raise ValueError(
                    "critic_peft_config needs separate critics; with use_separate_critic=False the value head sits on "
                    "each actor, which peft_config already covers"
                )
            self._critic_peft_configs = resolve_peft_configs(self._critic_peft_config, len(self._resolved_critics), "critics")
            check_not_already_peft(self._resolved_critics, "critics")

    def _resolve_critic_placement(self, args) -> None:
        """`critic_devices`, one per separate critic (or one for all); unset, the critics' default devices when
        the agents are placed. Value heads on the actors follow their actors."""
        requested = getattr(args, "critic_devices", None)  # MARLHF's config has no critic_devices: the defaults
        if self._resolved_critics is None:
            if requested is not None:
                raise ValueError(
                    f"critic_devices={requested!r} needs separate critics; with use_separate_critic=False each value head "
                    "sits on its actor and follows agent_devices"
                )
            return
        count = len(self._resolved_critics)
        owner = "critics" if count > 1 else "critics (one centralized critic)"
        self._critic_devices = resolve_devices("critic_devices", requested, count, owner)
        if self._critic_devices is None and self._agent_devices is not None:
            self._critic_devices = self.default_critic_devices(args, count)

    def default_critic_devices(self, args, count: int) -> list[torch.device]:
        """Where critics go when the agents are placed and `critic_devices` is unset: the trainer's device."""
        return [args.device] * count

    def _load_critic(self, source, tokenizer, where: str, hidden_dim: int | None, seed: int, index: int = 0):
        critic = load_causal_lm(source, self.model_config)
        check_vocab_fits(critic, tokenizer, where)
        if self._critic_peft_configs is not None:
            with seeded_stream(seed):
                critic = wrap_separate(critic, self._critic_peft_configs[index])
        return attach_value_head(critic, hidden_dim, seed)

    # ---- values ----
    def row_values(self, turn: TurnRollout, agent_index: int) -> torch.Tensor:
        """Critic values of agent `agent_index`'s rows in `turn` [rows] (with grad if enabled)."""
        raise NotImplementedError

    @staticmethod
    def _state_or_action_values(model, r: AgentRollout, critic_type: str) -> torch.Tensor:
        """One forward over prompt+completion: V at the last prompt token, Q at the last completion token."""
        device = next(model.parameters()).device  # the rows were generated on the actor's device
        ids = torch.cat([r.prompt_ids, r.completion_ids], dim=1).to(device)
        mask = torch.cat([r.prompt_mask, r.completion_mask.to(r.prompt_mask.dtype)], dim=1).to(device)
        values = token_values(model, ids, mask)
        prompt_len = r.prompt_ids.shape[1]
        if critic_type == "v":
            return values[:, prompt_len - 1]
        last = prompt_len + r.completion_mask.sum(dim=1) - 1
        return values.gather(1, last.unsqueeze(1)).squeeze(1)

    # ---- rollout ----
    def rollout(self, batch: list[dict]) -> ActorCriticRollout:
        args, K = self.args, self.args.num_generations
        turns = self._roll_out(batch, K, "aligned", args.early_termination_threshold, do_sample=True)
        rewards = [turn.rewards.reshape(-1).to(args.device) for turn in turns]  # row n*K + k = joint action k of node n
        # aligned with K = 1 beyond the first turn: row n continues in the child node's single row
        next_rows = [
            [None if turn.children[n // K] is None else turn.children[n // K][n % K] * K for n in range(turn.rewards.numel())]
            for turn in turns
        ]
        targets = [[None] * self.num_agents for _ in turns]
        old_values = [[None] * self.num_agents for _ in turns]
        with torch.no_grad():
            # on the trainer's device with the rewards: GAE runs there, whatever device each critic is on
            values = [[self.row_values(turn, i).float().to(args.device) for i in range(self.num_agents)] for turn in turns]
        gae = [tree_gae(rewards, [v[i] for v in values], next_rows, args.discount, args.gae_lambda)
               for i in range(self.num_agents)]  # per agent: (advantages, targets), each [turn] -> [rows]
        # z-scored over the global batch: N processes then give each row the advantage one process would
        every = self._gather_turns([adv for adv, _ in gae]) if args.normalize_advantages else None
        for i, (adv, tgt) in enumerate(gae):
            for t, turn in enumerate(turns):
                a = adv[t]
                if every is not None and every[i][t].numel() > 1:
                    a = (a - every[i][t].mean()) / (every[i][t].std() + 1e-8)
                turn.advantages.append(a.to(self.agent_device(i)))
                targets[t][i], old_values[t][i] = tgt[t], values[t][i]
            self.record_metric(f"agent_{i}/value_mean", torch.cat([v[i] for v in values]).mean())
        returns = discounted_returns([turn.rewards for turn in turns], [turn.children for turn in turns], args.discount)
        self.finish_rollout(turns, returns, [(k,) * self.num_agents for k in range(K)])
        return ActorCriticRollout(turns, targets, old_values)

    # ---- losses ----
    def critic_value_loss(self, inputs: ActorCriticRollout, agent_index: int) -> torch.Tensor:
        """Value loss of the critic serving `agent_index`, over every turn (rows weighted equally)."""
        losses, weights = [], []
        for t, turn in enumerate(inputs.turns):
            values = self.row_values(turn, agent_index).float()  # on the critic's device
            target, old = inputs.value_targets[t][agent_index], inputs.old_values[t][agent_index]
            losses.append(value_loss(values, target.to(values.device), old.to(values.device), self.args.value_clip_range))
            weights.append(values.numel())
        total = sum(weights)
        loss = sum(w / total * loss for w, loss in zip(weights, losses))
        return self._scale_for_ranks(loss, total, f"value_{agent_index}")  # N processes: mean over all rows

    def loss_weights(self, inputs: ActorCriticRollout) -> dict[str, float]:
        weights = super().loss_weights(inputs)
        critics = 1 if self._container.critic_layout == "central" else self.num_agents  # MAAC: one value loss
        for i in range(critics):
            weights[f"value_{i}"] = float(sum(turn.agents[i].completion_ids.shape[0] for turn in inputs.turns))
        return weights

    def _gather_turns(self, per_agent: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
        """[agent][turn] -> rows of every process, concatenated in process order (one collective per rollout;
        a process whose episodes all ended early holds fewer turns)."""
        if not self._distributed:
            return per_agent
        parts = self._gather_objects([[t.detach().cpu() for t in turns] for turns in per_agent])
        out = []
        for i, turns in enumerate(per_agent):
            depth = max(len(part[i]) for part in parts)
            out.append([torch.cat([part[i][t] for part in parts if t < len(part[i])]).to(turns[0].device)
                        for t in range(depth)])
        return out
