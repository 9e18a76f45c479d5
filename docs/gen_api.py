"""Generate docs/api.md from the docstrings (and config fields' help texts).

    python docs/gen_api.py            # rewrite docs/api.md
    python docs/gen_api.py --stdout   # print it (tests/test_docs.py compares the two)
"""

import dataclasses
import importlib
import inspect
import sys
from pathlib import Path

SECTIONS = [
    ("Trainers", "comlrl_hf.trainers.reinforce", ["MAGRPOTrainer", "MAREINFORCETrainer", "MARLOOTrainer", "MAReMaxTrainer"]),
    ("Trainers", "comlrl_hf.trainers.actor_critic", ["IACTrainer", "MAACTrainer"]),
    ("Trainers", "comlrl_hf.trainers.preference", ["MARLHFTrainer", "MARLHFIterTrainer"]),
    ("Trainers", "comlrl_hf.trainers.base", ["MultiAgentTrainer"]),
    ("Configs", "comlrl_hf.trainers.config", ["MultiAgentConfig"]),
    ("Configs", "comlrl_hf.trainers.reinforce", ["MAGRPOConfig", "MAREINFORCEConfig", "MARLOOConfig", "MAReMaxConfig"]),
    ("Configs", "comlrl_hf.trainers.actor_critic", ["ActorCriticConfig", "IACConfig", "MAACConfig"]),
    ("Configs", "comlrl_hf.trainers.preference", ["MARLHFConfig", "MARLHFIterConfig"]),
    ("Models", "comlrl_hf.models", ["MultiAgentModel"]),
    ("Utilities", "comlrl_hf.utils", ["read_checkpoint_metadata", "CheckpointError"]),
    ("Utilities", "comlrl_hf.rewards", ["length_ratio_reward", "format_reward", "exact_match_reward", "space_share_reward"]),
    ("Utilities", "comlrl_hf.sandbox", ["run_tests", "SandboxResult"]),
    ("Utilities", "comlrl_hf.testing", ["save_tiny_model", "build_tiny_model", "build_tokenizer"]),
    ("Command line", "comlrl_hf.cli", ["main"]),
    ("Command line", "comlrl_hf.recipe", ["ScriptArguments", "RecipeError"]),
]
# Fields declared by these classes are listed (TrainingArguments' own are documented upstream).
OWN_FIELDS_OF = ("comlrl_hf.",)


def _signature(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"


def _fields(cls) -> list[str]:
    if not dataclasses.is_dataclass(cls):
        return []
    own = [f for f in dataclasses.fields(cls) if f.name in vars(cls).get("__annotations__", {})]
    rows = []
    for f in own:
        default = f.default if f.default is not dataclasses.MISSING else "(factory)"
        help_text = " ".join(str(f.metadata.get("help", "")).split()).replace("|", "\\|")
        rows.append(f"| `{f.name}` | `{default!r}` | {help_text} |")
    return (["", "| field | default | help |", "|---|---|---|"] + rows) if rows else []


def render() -> str:
    out = ["# API reference", "", "Generated from the docstrings by `python docs/gen_api.py`; do not edit by hand.", ""]
    current = None
    for section, module_name, names in SECTIONS:
        if section != current:
            out += [f"## {section}", ""]
            current = section
        module = importlib.import_module(module_name)
        for name in names:
            obj = getattr(module, name)
            kind = "class" if inspect.isclass(obj) else "function"
            signature = "" if kind == "class" and issubclass(obj, Exception) else _signature(obj)
            if kind == "class" and dataclasses.is_dataclass(obj):
                signature = "(...)"  # dozens of fields: see the table
            out += [f"### `{module_name}.{name}`", "", f"{kind} `{name}{signature}`", ""]
            doc = inspect.getdoc(obj) or ""
            out += [doc.replace("```python", "```text"), *_fields(obj), ""]
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    text = render()
    if "--stdout" in sys.argv:
        sys.stdout.write(text)
    else:
        (Path(__file__).with_name("api.md")).write_text(text, encoding="utf-8")
