"""Configs of the actor-critic trainers (IAC, MAAC)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config import MultiAgentConfig
from ..placement import normalize_devices


@dataclass
class ActorCriticConfig(MultiAgentConfig):
    r"""
    Fields shared by [`IACConfig`] and [`MAACConfig`], on top of [`MultiAgentConfig`].

        num_generations (`int`, defaults to `1`): samples per agent per prompt; multi-turn needs 1.
        critic_type (`str`, defaults to `"v"`): `"v"` values the state (the prompt, a learned baseline);
            `"q"` values the state and the action (prompt and completion).
        gae_lambda (`float`, defaults to `0.95`): GAE's lambda over turns (0: TD(0) as in the original comlrl).
        value_loss_coef (`float`, defaults to `0.6`): weight of the value loss.
        value_clip_range (`float` or `None`, defaults to `0.2`): PPO value clipping around the rollout's values.
        normalize_advantages (`bool`, defaults to `True`): z-score each agent's advantages within a turn.
        critic_devices (`list[str]` or `None`): the device of each separate critic (IAC: one per agent or one for
            all; MAAC: one for the centralized critic). `None`: IAC critic i sits with agent i, the MAAC critic on
            the trainer's device. Value heads on the actors (`use_separate_critic=False`) follow `agent_devices`.
    """

    num_generations: int = field(default=1, metadata={"help": "Samples per agent per prompt (1 for multi-turn)."})
    critic_type: str = field(default="v", metadata={"help": "'v' (state value) or 'q' (state-action value)."})
    gae_lambda: float = field(default=0.95, metadata={"help": "GAE lambda over turns (0: TD(0))."})
    value_loss_coef: float = field(default=0.6, metadata={"help": "Weight of the value loss."})
    value_clip_range: float | None = field(default=0.2, metadata={"help": "Value clipping range (None: off)."})
    normalize_advantages: bool = field(default=True, metadata={"help": "Z-score advantages per agent and turn."})
    critic_devices: list[str] | None = field(
        default=None,
        metadata={"help": "Device of each separate critic (IAC: one per agent or one for all; MAAC: one); None: IAC "
                          "critics with their agents, the MAAC critic on the trainer's device."},
    )

    def __post_init__(self):
        check_actor_critic_fields(self)
        self.critic_devices = normalize_devices("critic_devices", self.critic_devices)
        super().__post_init__()


def check_actor_critic_fields(self) -> None:
    """The actor-critic rules (shared with MARLHF's `rl_algorithm="iac"|"maac"`)."""
    self.critic_type = str(self.critic_type).lower()
    if self.critic_type not in ("v", "q"):
        raise ValueError(f"critic_type must be 'v' or 'q', got {self.critic_type!r}")
    if self.num_turns > 1 and self.num_generations != 1:
        raise ValueError(
            f"multi-turn actor-critic (num_turns={self.num_turns}) needs num_generations=1, got {self.num_generations}"
        )
    if self.joint_mode != "aligned":
        raise ValueError(f"actor-critic trainers use joint_mode='aligned', got {self.joint_mode!r}")
    if not 0 <= self.gae_lambda <= 1:
        raise ValueError(f"gae_lambda must be in [0, 1], got {self.gae_lambda!r}")
    if not self.value_loss_coef > 0:
        raise ValueError(f"value_loss_coef must be > 0, got {self.value_loss_coef!r}")
    if self.value_clip_range is not None and not self.value_clip_range > 0:
        raise ValueError(f"value_clip_range must be > 0 or None, got {self.value_clip_range!r}")


@dataclass
class IACConfig(ActorCriticConfig):
    """Independent actor-critic: one critic per agent, separate (`use_separate_critic=True`) or a value head
    on the actor's own backbone (`False`)."""

    use_separate_critic: bool = field(default=True, metadata={"help": "One separate critic model per agent."})
    value_head_hidden_dim: int | None = field(
        default=None, metadata={"help": "Hidden width of the value head on the actor (use_separate_critic=False)."}
    )
    critic_value_head_hidden_dim: int | None = field(
        default=None, metadata={"help": "Hidden width of each separate critic's value head."}
    )


@dataclass
class MAACConfig(ActorCriticConfig):
    """Multi-agent actor-critic: one centralized critic over the joint input. A hidden layer in its head is
    set with the trainer's `model_config={"critic_value_head_hidden_dim": ...}` (as in the original)."""
