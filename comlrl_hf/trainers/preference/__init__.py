from .config import MARLHFConfig, MARLHFIterConfig
from .marlhf import MARLHFIterTrainer, MARLHFTrainer

__all__ = ["MARLHFConfig", "MARLHFTrainer", "MARLHFIterConfig", "MARLHFIterTrainer"]
