from .actor_critic import ActorCriticConfig, IACConfig, IACTrainer, MAACConfig, MAACTrainer
from .base import MultiAgentTrainer
from .config import MultiAgentConfig
from .preference import MARLHFConfig, MARLHFIterConfig, MARLHFIterTrainer, MARLHFTrainer
from .reinforce import (
    MAGRPOConfig, MAGRPOTrainer, MAREINFORCEConfig, MAREINFORCETrainer, MAReMaxConfig, MAReMaxTrainer,
    MARLOOConfig, MARLOOTrainer,
)

__all__ = [
    "ActorCriticConfig", "IACConfig", "IACTrainer", "MAACConfig", "MAACTrainer",
    "MultiAgentConfig", "MultiAgentTrainer",
    "MAGRPOConfig", "MAGRPOTrainer", "MAREINFORCEConfig", "MAREINFORCETrainer",
    "MAReMaxConfig", "MAReMaxTrainer", "MARLOOConfig", "MARLOOTrainer",
    "MARLHFConfig", "MARLHFTrainer", "MARLHFIterConfig", "MARLHFIterTrainer",
]
