from .config import ActorCriticConfig, IACConfig, MAACConfig
from .iac import IACTrainer
from .maac import MAACTrainer

__all__ = ["ActorCriticConfig", "IACConfig", "IACTrainer", "MAACConfig", "MAACTrainer"]
