from .multi_agent import MultiAgentModel

__all__ = ["MultiAgentModel"]
