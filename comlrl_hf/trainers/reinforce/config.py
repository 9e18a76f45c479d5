"""Configs of the MAGRPO family: one algorithm, four baselines."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...utils.advantages import ADVANTAGE_MODES, SCALE_REWARDS
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

    """

    num_generations: int = field(default=4, metadata={"help": "Completions per agent per prompt (K >= 2)."})
    advantage_mode: str = field(
        default="mean", metadata={"help": f"Group baseline, one of {ADVANTAGE_MODES}.", "choices": list(ADVANTAGE_MODES)}
    )
    scale_rewards: str = field(
        default="group", metadata={"help": f"Advantage scale, one of {SCALE_REWARDS}.", "choices": list(SCALE_REWARDS)}
    )
    def __post_init__(self):
        check_group_baseline_fields(self)
        super().__post_init__()


def check_group_baseline_fields(self) -> None:
    """The MAGRPO-family rules (shared with MARLHF's `rl_algorithm="magrpo"|...`)."""
    if self.num_generations < 2:
        raise ValueError(f"num_generations must be >= 2 for a group baseline, got {self.num_generations}")
    for name, value, allowed in (
        ("advantage_mode", self.advantage_mode, ADVANTAGE_MODES),
        ("scale_rewards", self.scale_rewards, SCALE_REWARDS),
    ):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


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
