"""comlrl_hf: cooperative multi-LLM reinforcement learning on transformers.Trainer."""

__version__ = "0.1.0"

from .models import MultiAgentModel
from .trainers import (
    IACConfig, IACTrainer, MAACConfig, MAACTrainer,
    MAGRPOConfig, MAGRPOTrainer, MAREINFORCEConfig, MAREINFORCETrainer, MAReMaxConfig, MAReMaxTrainer,
    MARLHFConfig, MARLHFIterConfig, MARLHFIterTrainer, MARLHFTrainer, MARLOOConfig, MARLOOTrainer,
    MultiAgentConfig, MultiAgentTrainer,
)

__all__ = [
    "IACConfig", "IACTrainer", "MAACConfig", "MAACTrainer",
    "MultiAgentModel", "MultiAgentConfig", "MultiAgentTrainer",
    "MAGRPOConfig", "MAGRPOTrainer", "MAREINFORCEConfig", "MAREINFORCETrainer",
    "MAReMaxConfig", "MAReMaxTrainer", "MARLOOConfig", "MARLOOTrainer",
    "MARLHFConfig", "MARLHFTrainer", "MARLHFIterConfig", "MARLHFIterTrainer",
]
