from .base import MultiAgentTrainer
from .config import MultiAgentConfig
from .reinforce import (
    MAGRPOConfig, MAGRPOTrainer, MAREINFORCEConfig, MAREINFORCETrainer, MAReMaxConfig, MAReMaxTrainer,
    MARLOOConfig, MARLOOTrainer,
)

__all__ = [
    "MultiAgentConfig", "MultiAgentTrainer",
    "MAGRPOConfig", "MAGRPOTrainer", "MAREINFORCEConfig", "MAREINFORCETrainer",
    "MAReMaxConfig", "MAReMaxTrainer", "MARLOOConfig", "MARLOOTrainer",
]
