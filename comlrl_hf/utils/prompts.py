"""Prompts as text."""

from __future__ import annotations


def prompt_text(prompt: str | list) -> str:
    """A prompt as plain text: itself, or a chat's message contents one per line (for models that read
    several agents' prompts at once: the centralized critic, the joint reward model)."""
    return prompt if isinstance(prompt, str) else "\n".join(str(m.get("content", "")) for m in prompt)
