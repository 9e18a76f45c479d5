"""Configs of the preference-based trainers (MARLHF, MARLHFIter)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...utils.advantages import ADVANTAGE_MODES, SCALE_REWARDS
from ...utils.preference import PAIR_SELECTIONS
from ..actor_critic.config import check_actor_critic_fields
from ..config import MultiAgentConfig
from ..reinforce.config import check_group_baseline_fields

# rl_algorithm -> the MAGRPO baseline it implies (actor-critic algorithms have none)
RL_ALGORITHMS = {"magrpo": "mean", "mareinforce": "raw", "maremax": "max", "marloo": "rloo", "iac": None, "maac": None}


@dataclass
class MARLHFConfig(MultiAgentConfig):
    r"""
    Configuration of [`MARLHFTrainer`]: every field of [`MultiAgentConfig`] plus the fields below.

    > Preference pairs (labelled by the task `reward_func`)

        preference_num_candidates (`int`, defaults to `16`): aligned joint candidates sampled per prompt.
        preference_pairs_per_sample (`int` or `None`, defaults to `4`): pairs kept per prompt (`None`: all).
        pair_selection (`str`, defaults to `"reward_gap"`): `"reward_gap"` (largest task-reward gaps first),
            `"random"` or `"all"` (then `preference_pairs_per_sample` must be None). Ties are dropped.

    > The joint reward model (Bradley-Terry)

        reward_model_name (`str` or `None`): Hub id or local directory of its causal-LM backbone; `None` takes
            the first agent's id (required when the agents are model objects without one).
        reward_model_device (`str` or `None`, defaults to `"cuda:0"`): its device; `None` is the trainer's
            device. Without CUDA a CUDA device falls back to the trainer's device with a warning.
        reward_learning_rate (`float`, defaults to `1e-5`), reward_num_train_epochs (`int`, defaults to `1`),
        reward_train_batch_size (`int`, defaults to `8`): AdamW on the Bradley-Terry loss.
        reward_max_length (`int` or `None`): truncate the joint text to this many tokens.
        reward_freeze_backbone (`bool`, defaults to `False`): train only the scalar head.
        reward_eval_fraction (`float`, defaults to `0.1`): share of the pairs held out to measure the reward
            model's accuracy (logged as `reward_model/eval_accuracy` before and after each epoch).

    > Reinforcement learning against the frozen reward model

        rl_algorithm (`str`, defaults to `"magrpo"`): `"magrpo"`, `"mareinforce"`, `"maremax"`, `"marloo"`
            (the MAGRPO family: their baseline unless `advantage_mode` is set), `"iac"` or `"maac"`.
        advantage_mode / scale_rewards (`str` or `None`): as in [`MAGRPOConfig`]; `None` follows
            `rl_algorithm` (scale `"group"` for magrpo, `"none"` for the others).
        critic_model_name (`str` or `None`): the critics' backbone for iac/maac when the trainer gets neither
            `critic_model` nor `critics` (`None`: the first agent's id).
        critic_type, gae_lambda, value_loss_coef, value_clip_range, normalize_advantages, use_separate_critic,
        value_head_hidden_dim, critic_value_head_hidden_dim: as in [`IACConfig`] / [`MAACConfig`].

    Evaluation always scores with the task reward. Episodes are single-turn with aligned joint actions.
    """

    rl_algorithm: str = field(default="magrpo", metadata={"help": f"RL backend, one of {list(RL_ALGORITHMS)}."})
    preference_num_candidates: int = field(default=16, metadata={"help": "Aligned joint candidates per prompt."})
    preference_pairs_per_sample: int | None = field(
        default=4, metadata={"help": "Preference pairs kept per prompt (None: all)."}
    )
    pair_selection: str = field(default="reward_gap", metadata={"help": f"One of {PAIR_SELECTIONS}."})
    reward_model_name: str | None = field(
        default=None, metadata={"help": "Backbone of the reward model (hub id or directory); None: the first agent's."}
    )
    reward_model_device: str | None = field(
        default="cuda:0", metadata={"help": "Device of the reward model; None: the trainer's device."}
    )
    reward_learning_rate: float = field(default=1e-5, metadata={"help": "AdamW learning rate of the reward model."})
    reward_num_train_epochs: int = field(default=1, metadata={"help": "Epochs over the preference pairs."})
    reward_train_batch_size: int = field(default=8, metadata={"help": "Pairs per reward-model update."})
    reward_max_length: int | None = field(default=None, metadata={"help": "Token limit of the reward model's input."})
    reward_freeze_backbone: bool = field(default=False, metadata={"help": "Train only the reward model's head."})
    reward_eval_fraction: float = field(
        default=0.1, metadata={"help": "Share of pairs held out to measure reward-model accuracy."}
    )
    # MAGRPO family
    advantage_mode: str | None = field(default=None, metadata={"help": "Group baseline; None follows rl_algorithm."})
    scale_rewards: str | None = field(default=None, metadata={"help": "Advantage scale; None follows rl_algorithm."})
    # actor-critic
    critic_model_name: str | None = field(default=None, metadata={"help": "Critic backbone for iac/maac."})
    critic_type: str = field(default="v", metadata={"help": "'v' (state value) or 'q' (state-action value)."})
    gae_lambda: float = field(default=0.95, metadata={"help": "GAE lambda (actor-critic)."})
    value_loss_coef: float = field(default=0.6, metadata={"help": "Weight of the value loss (actor-critic)."})
    value_clip_range: float | None = field(default=0.2, metadata={"help": "Value clipping range (None: off)."})
    normalize_advantages: bool = field(default=True, metadata={"help": "Z-score actor-critic advantages."})
    use_separate_critic: bool = field(default=True, metadata={"help": "IAC: one separate critic per agent."})
    value_head_hidden_dim: int | None = field(default=None, metadata={"help": "IAC shared value head width."})
    critic_value_head_hidden_dim: int | None = field(default=None, metadata={"help": "IAC separate critic head width."})

    def __post_init__(self):
        self.rl_algorithm = str(self.rl_algorithm).lower()
        if self.rl_algorithm not in RL_ALGORITHMS:
            raise ValueError(f"rl_algorithm must be one of {list(RL_ALGORITHMS)}, got {self.rl_algorithm!r}")
        if self.num_turns != 1 or self.joint_mode != "aligned":
            raise ValueError(
                f"preference trainers run single-turn aligned episodes; got num_turns={self.num_turns}, "
                f"joint_mode={self.joint_mode!r}"
            )
        if self.is_actor_critic:
            for name in ("advantage_mode", "scale_rewards"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} applies to the MAGRPO family, not rl_algorithm={self.rl_algorithm!r}")
            check_actor_critic_fields(self)
        else:
            self.advantage_mode = self.advantage_mode or RL_ALGORITHMS[self.rl_algorithm]
            self.scale_rewards = self.scale_rewards or ("group" if self.rl_algorithm == "magrpo" else "none")
            check_group_baseline_fields(self)
        for name in ("preference_num_candidates", "reward_num_train_epochs", "reward_train_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.preference_num_candidates < 2:
            raise ValueError(f"preference_num_candidates must be >= 2 to form pairs, got {self.preference_num_candidates}")
        if self.pair_selection not in PAIR_SELECTIONS:
            raise ValueError(f"pair_selection must be one of {PAIR_SELECTIONS}, got {self.pair_selection!r}")
        if self.pair_selection == "all" and self.preference_pairs_per_sample is not None:
            raise ValueError(
                f"pair_selection='all' keeps every pair; preference_pairs_per_sample must be None, "
                f"got {self.preference_pairs_per_sample!r}"
            )
        count = self.preference_pairs_per_sample
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
            raise ValueError(f"preference_pairs_per_sample must be an integer >= 1 or None, got {count!r}")
        if not (isinstance(self.reward_learning_rate, (int, float)) and self.reward_learning_rate > 0
                and math.isfinite(self.reward_learning_rate)):
            raise ValueError(f"reward_learning_rate must be a finite number > 0, got {self.reward_learning_rate!r}")
        if self.reward_max_length is not None and (not isinstance(self.reward_max_length, int) or self.reward_max_length < 1):
            raise ValueError(f"reward_max_length must be an integer >= 1 or None, got {self.reward_max_length!r}")
        if not 0 <= self.reward_eval_fraction < 1:
            raise ValueError(f"reward_eval_fraction must be in [0, 1), got {self.reward_eval_fraction!r}")
        super().__post_init__()

    @property
    def is_actor_critic(self) -> bool:
        return RL_ALGORITHMS[self.rl_algorithm] is None


@dataclass
class MARLHFIterConfig(MARLHFConfig):
    r"""
    Configuration of [`MARLHFIterTrainer`]: [`MARLHFConfig`] plus

        num_iterations (`int`, defaults to `3`): rounds of (reload the reward model from its source, collect
            pairs with the current policy, learn preferences, `num_train_epochs` epochs of RL). It counts the
            whole run and may be raised on resume.

    `num_train_epochs` (default 2) is the RL epochs of each iteration.
    """

    num_train_epochs: float = field(default=2.0, metadata={"help": "RL epochs per iteration."})
    num_iterations: int = field(default=3, metadata={"help": "Preference iterations in the whole run."})

    def __post_init__(self):
        if isinstance(self.num_iterations, bool) or not isinstance(self.num_iterations, int) or self.num_iterations < 1:
            raise ValueError(f"num_iterations must be an integer >= 1, got {self.num_iterations!r}")
        if self.num_train_epochs != int(self.num_train_epochs) or self.num_train_epochs < 1:
            raise ValueError(f"num_train_epochs (per iteration) must be a whole number >= 1, got {self.num_train_epochs!r}")
        super().__post_init__()
