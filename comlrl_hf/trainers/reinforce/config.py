"""Configs of the MAGRPO family: one algorithm, four baselines."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...utils.advantages import ADVANTAGE_MODES, SCALE_REWARDS
from ...utils.losses import LOSS_TYPES
from ..config import MultiAgentConfig


@dataclass
class MAGRPOConfig(MultiAgentConfig):
    r"""
    Configuration of [`MAGRPOTrainer`]: every field of [`MultiAgentConfig`] plus the fields below.

    > Advantages (see `comlrl_hf.utils.advantages`)

        advantage_mode (`str`, defaults to `"mean"`): group baseline: `"mean"` (MAGRPO), `"raw"` (no baseline,
            MAREINFORCE), `"max"` (best sample of the group, MAReMax), `"rloo"` (leave-one-out, MARLOO).
        scale_rewards (`str`, defaults to `"group"`): divide advantages by the reward std of the `"group"`,
            the `"batch"`, or `"none"`. Advantages are never re-centred, so the four baselines stay different.

    > Loss (see `comlrl_hf.utils.losses`)

        loss_type (`str`, defaults to `"grpo"`): `"grpo"` (per-sequence token mean), `"dapo"` (token mean over
            the micro-batch) or `"dr_grpo"` (token sum / (sequences x max_new_tokens)).
        num_iterations (`int`, defaults to `1`): optimizer passes per rollout batch; above 1 the ratio to the
            sampling policy is clipped to [1 - epsilon, 1 + epsilon_high].
        epsilon (`float`, defaults to `0.2`), epsilon_high (`float` or `None`: same as epsilon)
        beta (`float`, defaults to `0.0`): weight of the k3 KL to a frozen copy of each initial agent (0: no
            reference model is kept).

    > Logging

        log_completions (`bool`, defaults to `False`): log a table of prompts and each agent's completion at
            every log (printed, and to W&B when it reports there).
        num_completions_to_print (`int`, defaults to `4`): rows of that table.
    """

    num_generations: int = field(default=4, metadata={"help": "Completions per agent per prompt (K >= 2)."})
    advantage_mode: str = field(
        default="mean", metadata={"help": f"Group baseline, one of {ADVANTAGE_MODES}.", "choices": list(ADVANTAGE_MODES)}
    )
    scale_rewards: str = field(
        default="group", metadata={"help": f"Advantage scale, one of {SCALE_REWARDS}.", "choices": list(SCALE_REWARDS)}
    )
    loss_type: str = field(
        default="grpo", metadata={"help": f"Loss normalisation, one of {LOSS_TYPES}.", "choices": list(LOSS_TYPES)}
    )
    num_iterations: int = field(default=1, metadata={"help": "Optimizer passes per rollout batch (mu)."})
    epsilon: float = field(default=0.2, metadata={"help": "Lower clipping range of the policy ratio."})
    epsilon_high: float | None = field(default=None, metadata={"help": "Upper clipping range (None: epsilon)."})
    beta: float = field(default=0.0, metadata={"help": "KL coefficient to the initial policy (0 keeps no reference)."})
    log_completions: bool = field(default=False, metadata={"help": "Log a table of sampled completions."})
    num_completions_to_print: int = field(default=4, metadata={"help": "Rows of the completions table."})

    def __post_init__(self):
        if self.num_generations < 2:
            raise ValueError(
                f"num_generations must be >= 2 for a group baseline, got {self.num_generations}"
            )
        for name, value, allowed in (
            ("advantage_mode", self.advantage_mode, ADVANTAGE_MODES),
            ("scale_rewards", self.scale_rewards, SCALE_REWARDS),
            ("loss_type", self.loss_type, LOSS_TYPES),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if not isinstance(self.num_iterations, int) or self.num_iterations < 1:
            raise ValueError(f"num_iterations must be an integer >= 1, got {self.num_iterations!r}")
        if not self.epsilon > 0 or (self.epsilon_high is not None and not self.epsilon_high > 0):
            raise ValueError(f"epsilon and epsilon_high must be > 0, got {self.epsilon!r} and {self.epsilon_high!r}")
        if not self.beta >= 0:
            raise ValueError(f"beta must be >= 0, got {self.beta!r}")
        super().__post_init__()


@dataclass
class MAREINFORCEConfig(MAGRPOConfig):
    """MAGRPO with no baseline and no scaling: the advantage is the raw joint reward."""

    advantage_mode: str = field(default="raw", metadata={"help": "Group baseline (MAREINFORCE: 'raw')."})
    scale_rewards: str = field(default="none", metadata={"help": "Advantage scale (MAREINFORCE: 'none')."})


@dataclass
class MARLOOConfig(MAGRPOConfig):
    """MAGRPO with the leave-one-out baseline and no scaling (RLOO)."""

    advantage_mode: str = field(default="rloo", metadata={"help": "Group baseline (MARLOO: 'rloo')."})
    scale_rewards: str = field(default="none", metadata={"help": "Advantage scale (MARLOO: 'none')."})


@dataclass
class MAReMaxConfig(MAGRPOConfig):
    """MAGRPO with the group's best reward as baseline and no scaling (ReMax-style)."""

    advantage_mode: str = field(default="max", metadata={"help": "Group baseline (MAReMax: 'max')."})
    scale_rewards: str = field(default="none", metadata={"help": "Advantage scale (MAReMax: 'none')."})
