"""Calling the user's joint reward function once per batch, and checking what it returns."""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch


class JointRewardCaller:
    """Calls `reward_func(completions_agent_0, ..., completions_agent_{N-1}[, prompts=][, batch_items=])`.

    The signature is checked once, at construction; the function is then called exactly once per batch with
    one list per agent (entry j of every list belongs to joint action j). A `TypeError` raised inside the
    function propagates unchanged: nothing is retried with another calling convention.
    """

    def __init__(self, reward_func: Callable, num_agents: int, reward_processor: Callable | None = None):
        if not callable(reward_func):
            raise ValueError(f"reward_func must be callable, got {type(reward_func).__name__}: {reward_func!r:.100}")
        if reward_processor is not None and not callable(reward_processor):
            raise ValueError(f"reward_processor must be callable, got {type(reward_processor).__name__}")
        self.reward_func = reward_func
        self.reward_processor = reward_processor
        self.num_agents = num_agents
        try:
            params = inspect.signature(reward_func).parameters.values()
        except (TypeError, ValueError):  # builtins without a signature: pass the agent lists only
            params = []
            self._var_positional = True
        else:
            self._var_positional = any(p.kind is p.VAR_POSITIONAL for p in params)
        var_keyword = any(p.kind is p.VAR_KEYWORD for p in params)
        names = {p.name for p in params}
        self._pass_prompts = "prompts" in names or var_keyword
        self._pass_batch_items = "batch_items" in names or var_keyword
        positional = [
            p for p in params
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in ("prompts", "batch_items")
        ]
        required = [p for p in positional if p.default is p.empty]
        name = getattr(reward_func, "__name__", type(reward_func).__name__)
        if not self._var_positional and not (len(required) <= num_agents <= len(positional)):
            raise ValueError(
                f"reward_func {name}{inspect.signature(reward_func)} takes {len(positional)} positional "
                f"completion list(s) but there are {num_agents} agents; it is called as "
                f"{name}(completions_agent_0, ..., completions_agent_{num_agents - 1})"
            )

    def __call__(
        self,
        completions: Sequence[Sequence[str]],
        *,
        prompts: Sequence[Any],
        batch_items: Sequence[Any],
        step: int,
    ) -> list[float]:
        kwargs = {}
        if self._pass_prompts:
            kwargs["prompts"] = list(prompts)
        if self._pass_batch_items:
            kwargs["batch_items"] = list(batch_items)
        try:
            result = self.reward_func(*[list(c) for c in completions], **kwargs)
        except Exception as error:
            if hasattr(error, "add_note"):
                error.add_note(f"(raised by reward_func at step {step}, first prompt {_short(prompts[0])})")
            raise
        rewards = self._check(result, expected=len(completions[0]), step=step, prompts=prompts)
        if self.reward_processor is not None:
            rewards = self._check(
                [self.reward_processor(r) for r in rewards], len(rewards), step, prompts, who="reward_processor"
            )
        return rewards

    @staticmethod
    def _check(result, expected: int, step: int, prompts: Sequence[Any], who: str = "reward_func") -> list[float]:
        if isinstance(result, torch.Tensor):
            result = result.detach().cpu().reshape(-1).tolist()
        elif hasattr(result, "tolist") and not isinstance(result, (str, bytes)):
            result = result.tolist()
        if isinstance(result, (str, bytes)) or not isinstance(result, Sequence):
            raise ValueError(
                f"{who} must return a sequence of {expected} floats (one per joint action) at step {step}, "
                f"got {type(result).__name__}: {result!r:.100}"
            )
        if len(result) != expected:
            raise ValueError(
                f"{who} returned {len(result)} rewards at step {step} but {expected} joint actions were scored "
                f"(first prompt {_short(prompts[0])})"
            )
        rewards = []
        for j, value in enumerate(result):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(
                    f"{who} returned {value!r} for joint action {j} at step {step} (prompt {_short(prompts[j])}); "
                    "every reward must be a finite float"
                )
            rewards.append(float(value))
        return rewards


def _short(prompt: Any, limit: int = 80) -> str:
    text = repr(prompt)
    return text if len(text) <= limit else text[: limit - 3] + "..."
