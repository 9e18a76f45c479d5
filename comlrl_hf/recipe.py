"""What the `comlrl-hf` command reads: recipe files, the script's own arguments, callables named by import path,
and datasets from local files or the Hub.

Every problem with a recipe raises `RecipeError` with a one-line message naming the offending key or value;
the command prints it and exits with code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import importlib.util
import json
import os
import types
import typing
from dataclasses import dataclass, field
from functools import partial
from typing import Any

__all__ = ["RecipeError", "ScriptArguments", "load_recipe", "resolve_callable", "resolve_reward", "load_prompt_dataset"]

DATA_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


class RecipeError(ValueError):
    """A bad recipe or flag: unknown key, wrong type, unknown reward, missing file. One line, exit code 2."""


@dataclass
class ScriptArguments:
    """What the command needs besides the trainer's config: models, data, callables, checkpoints."""

    agent_model: str | None = field(
        default=None, metadata={"help": "Homogeneous agents: one Hub id or local model directory, copied num_agents times."}
    )
    agents: list[str] | None = field(
        default=None, metadata={"help": "Heterogeneous agents: one Hub id or local directory per agent."}
    )
    tokenizer: list[str] | None = field(
        default=None,
        metadata={"help": "Tokenizer sources (one, or one per agent). Default: each agent's own tokenizer "
                          "(IAC/MAAC too: the command loads them from the agents)."},
    )
    critic_model: str | None = field(default=None, metadata={"help": "IAC/MAAC: critic backbone (Hub id or directory)."})
    critics: list[str] | None = field(default=None, metadata={"help": "IAC/MAAC: critic backbones, one per critic."})
    model_config: str | None = field(
        default=None, metadata={"help": "Trainer model_config as JSON (a mapping in a recipe), e.g. {\"dtype\": \"bfloat16\"}."}
    )
    reward_func: str | None = field(
        default=None,
        metadata={"help": "Joint reward: a built-in name (length_ratio, format, exact_match, space_share) or an import "
                          "path 'package.module:function' or 'path/to/file.py:function'."},
    )
    reward_kwargs: str | None = field(
        default=None, metadata={"help": "Keyword arguments bound to the reward function, as JSON (a mapping in a recipe)."}
    )
    external_transition: str | None = field(
        default=None, metadata={"help": "Multi-turn transition, by import path 'module:function' or 'file.py:function'."}
    )
    formatters: list[str] | None = field(
        default=None, metadata={"help": "Prompt formatters by import path: one for all agents or one per agent."}
    )
    dataset: str | None = field(
        default=None,
        metadata={"help": "Training prompts: a local .json/.jsonl/.csv/.parquet file, or a Hub dataset id (online only)."},
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Hub dataset configuration name."})
    dataset_split: str = field(default="train", metadata={"help": "Split of a Hub dataset to train on."})
    eval_dataset: str | None = field(default=None, metadata={"help": "Evaluation prompts (same forms as dataset)."})
    eval_split: str = field(default="test", metadata={"help": "Split of a Hub evaluation dataset."})
    prompt_column: str = field(default="prompt", metadata={"help": "Column holding the prompt (renamed to 'prompt')."})
    prompts: list[str] | None = field(default=None, metadata={"help": "Inline training prompts instead of a dataset."})
    checkpoint_dir: str | None = field(default=None, metadata={"help": "Write checkpoint-K folders here (off if unset)."})
    checkpoint_interval: int | None = field(default=None, metadata={"help": "Write a checkpoint every K epochs."})
    save_dir: str | None = field(
        default=None, metadata={"help": "Where save_model writes agent_i/ after training (default: <output_dir>/final)."}
    )
    wandb_config: str | None = field(
        default=None, metadata={"help": "W&B settings as JSON (a mapping in a recipe): project, name, entity, tags, ..."}
    )


# Script fields that hold a mapping: a mapping in YAML, JSON text on the command line.
MAPPING_FIELDS = ("model_config", "reward_kwargs", "wandb_config")
# Script fields naming input files; relative paths in a recipe are tried against the recipe's folder too.
INPUT_PATH_FIELDS = ("agent_model", "agents", "tokenizer", "critic_model", "critics", "dataset", "eval_dataset",
                     "reward_func", "external_transition", "formatters")


def field_facts(dataclass_types) -> dict[str, tuple[bool, bool]]:
    """name -> (may be None, may be a mapping) for every field of the given dataclasses."""
    facts = {}
    for dtype in dataclass_types:
        hints = typing.get_type_hints(dtype)
        for f in dataclasses.fields(dtype):
            if not f.init:
                continue
            hint = hints.get(f.name, f.type)
            args = typing.get_args(hint)
            origin = typing.get_origin(hint)
            union = origin is typing.Union or origin is types.UnionType
            may_be_none = f.default is None or (union and type(None) in args)
            may_be_mapping = f.name in MAPPING_FIELDS or hint is dict or origin is dict or any(
                a is dict or typing.get_origin(a) is dict for a in args)
            facts[f.name] = (may_be_none, may_be_mapping)
    return facts


_TYPE_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}


def _type_name(action: argparse.Action) -> str:
    name = getattr(action.type, "__name__", None) or "str"
    return {"string_to_bool": "bool"}.get(name, name)


def coerce_value(key: str, value: Any, action: argparse.Action, facts: tuple[bool, bool], where: str) -> Any:
    """Check and convert one recipe value with the same converter the command line uses for its flag."""
    may_be_none, may_be_mapping = facts
    if value is None:
        if may_be_none:
            return None
        raise RecipeError(f"{where}: {key} may not be null")
    if isinstance(value, dict):
        if may_be_mapping:
            return value
        raise RecipeError(f"{where}: {key} expects {_describe(action)}, got a mapping {value!r:.80}")
    if action.nargs in ("+", "*"):
        items = value if isinstance(value, list) else [value]
        return [_scalar(key, item, action, where) for item in items]
    if isinstance(value, list):
        raise RecipeError(f"{where}: {key} expects {_describe(action)}, got a list {value!r:.80}")
    return _scalar(key, value, action, where)


def _describe(action: argparse.Action) -> str:
    if action.choices:
        return "one of " + ", ".join(str(getattr(c, "value", c)) for c in action.choices)
    name = _TYPE_WORDS.get(_type_name(action), _type_name(action))
    return f"a list of {_type_name(action)} values" if action.nargs in ("+", "*") else name


def _scalar(key: str, value: Any, action: argparse.Action, where: str) -> Any:
    if isinstance(value, (list, dict)):
        raise RecipeError(f"{where}: {key} expects {_describe(action)}, got {value!r:.80}")
    convert = action.type or str
    text = value if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)
    try:
        converted = convert(text)
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        raise RecipeError(f"{where}: {key} expects {_describe(action)}, got {value!r:.80}") from None
    if action.choices and converted not in action.choices:
        raise RecipeError(f"{where}: {key} expects {_describe(action)}, got {value!r:.80}")
    return converted


def load_recipe(path: str, actions: dict[str, argparse.Action], facts: dict[str, tuple[bool, bool]],
                owners: str) -> dict[str, Any]:
    """Read a YAML recipe: a mapping of field names to values. Unknown keys and wrong types raise `RecipeError`;
    relative input paths that exist next to the recipe are made absolute."""
    import yaml

    if not os.path.isfile(path):
        raise RecipeError(f"recipe file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise RecipeError(f"{path}: not valid YAML{where}: {getattr(error, 'problem', error)}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise RecipeError(f"{path}: a recipe is a mapping of field: value, got {type(raw).__name__}")
    values = {}
    for key, value in raw.items():
        if key not in actions or key == "config":
            close = difflib.get_close_matches(str(key), list(actions), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise RecipeError(f"{path}: unknown key {key!r} (not a field of {owners}){hint}")
        values[key] = coerce_value(key, value, actions[key], facts[key], path)
    base = os.path.dirname(os.path.abspath(path))
    for key in INPUT_PATH_FIELDS:
        if key in values and values[key] is not None:
            values[key] = ([_next_to(v, base) for v in values[key]] if isinstance(values[key], list)
                           else _next_to(values[key], base))
    return values


def _next_to(value: str, base: str) -> str:
    """A relative path that does not exist from the working directory but does next to the recipe."""
    file_part = value.split(":", 1)[0] if value.count(":") == 1 and ".py:" in value else value
    if os.path.isabs(file_part) or os.path.exists(file_part) or not os.path.exists(os.path.join(base, file_part)):
        return value
    return os.path.join(base, value)


def parse_mapping(key: str, value: Any) -> dict | None:
    """A mapping field: a dict from a recipe, or JSON text from the command line."""
    if value is None or isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as error:
        raise RecipeError(f"{key} must be a JSON object, got {value!r:.80} ({error.msg})") from None
    if not isinstance(parsed, dict):
        raise RecipeError(f"{key} must be a JSON object, got {value!r:.80}")
    return parsed


def resolve_callable(spec: str, what: str) -> Any:
    """'package.module:attr' or 'path/to/file.py:attr' -> the object."""
    if ":" not in spec:
        raise RecipeError(f"{what} {spec!r} is not an import path; write 'package.module:function' or 'file.py:function'")
    module_name, attr = spec.rsplit(":", 1)
    try:
        if module_name.endswith(".py"):
            if not os.path.isfile(module_name):
                raise RecipeError(f"{what} {spec!r}: file not found: {module_name}")
            name = "_comlrl_hf_recipe_" + os.path.splitext(os.path.basename(module_name))[0]
            module_spec = importlib.util.spec_from_file_location(name, module_name)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as error:
        raise RecipeError(f"{what} {spec!r}: cannot import {module_name!r} ({error})") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise RecipeError(f"{what} {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise RecipeError(f"{what} {spec!r} is not callable (a {type(obj).__name__})")
    return obj


def resolve_reward(spec: str | None, kwargs: dict | None) -> Any:
    from .rewards import BUILTIN_REWARDS

    if not spec:
        raise RecipeError("reward_func is required: a built-in name (" + ", ".join(BUILTIN_REWARDS)
                          + ") or an import path 'module:function'")
    if spec in BUILTIN_REWARDS:
        func = BUILTIN_REWARDS[spec]
    elif ":" in spec:
        func = resolve_callable(spec, "reward_func")
    else:
        raise RecipeError(f"unknown reward_func {spec!r}; built-in rewards are {', '.join(BUILTIN_REWARDS)}, "
                          "or give an import path 'module:function'")
    return partial(func, **kwargs) if kwargs else func


def load_prompt_dataset(spec: str, *, split: str, config_name: str | None, prompt_column: str, what: str = "dataset"):
    """A local data file (json, jsonl, csv, parquet) or, online, a Hub dataset; `prompt_column` becomes 'prompt'."""
    from datasets import load_dataset

    extension = os.path.splitext(spec)[1].lower()
    if os.path.isfile(spec):
        if extension not in DATA_FILE_BUILDERS:
            raise RecipeError(f"{what} {spec!r}: unsupported file type {extension!r}; use " + ", ".join(DATA_FILE_BUILDERS))
        data = load_dataset(DATA_FILE_BUILDERS[extension], data_files=spec, split="train")
    elif extension in DATA_FILE_BUILDERS or os.path.isabs(spec) or spec.startswith("."):
        raise RecipeError(f"{what} file not found: {spec}")
    elif os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        raise RecipeError(f"{what} {spec!r} is not a local file and the Hub is offline (HF_HUB_OFFLINE=1); "
                          "give a .json/.jsonl/.csv/.parquet file")
    else:
        data = load_dataset(spec, config_name, split=split)
    if prompt_column != "prompt":
        if prompt_column not in data.column_names:
            raise RecipeError(f"{what} {spec!r} has no column {prompt_column!r}; columns: {data.column_names}")
        if "prompt" in data.column_names:
            data = data.remove_columns("prompt")
        data = data.rename_column(prompt_column, "prompt")
    if len(data) == 0:
        raise RecipeError(f"{what} {spec!r} is empty")
    return data
