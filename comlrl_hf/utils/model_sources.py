"""Resolve where agents (and critics) come from, and their tokenizers, before anything is trained.

The rules are the user contract (spec §1, §1.3): a homogeneous shortcut (`agent_model`), a list
(`agents`: ids, local directories or loaded models), or both when they name the same model.
Every mismatch raises `ValueError` naming both values, before any model is loaded.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_NUM_AGENTS = 2
ModelSource = Any  # str | os.PathLike | torch.nn.Module

_MODEL_CONFIG_KEYS = {"dtype", "torch_dtype", "attn_implementation", "model_kwargs", "critic_value_head_hidden_dim"}


def source_name(source: ModelSource) -> str | None:
    """A comparable name: the path/id for strings, `name_or_path` for loaded models (None if unknown)."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    name = getattr(source, "name_or_path", None) or getattr(getattr(source, "config", None), "_name_or_path", None)
    return name or None


def _same_source(a: str, b: str) -> bool:
    if a == b:
        return True
    if os.path.exists(a) and os.path.exists(b):
        return os.path.realpath(a) == os.path.realpath(b)
    return False


def resolve_count(kind: str, argument: int | None, config_value: int | None, listed: Sequence | None) -> int:
    """The number of models of `kind` ("agents"): the constructor argument, the config value and the
    list length must agree wherever they are given."""
    for name, value in ((f"num_{kind}", argument), (f"config num_{kind}", config_value)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if argument is not None and config_value is not None and argument != config_value:
        raise ValueError(
            f"num_{kind}={argument} (trainer argument) disagrees with args.num_{kind}={config_value} (config)"
        )
    count = argument if argument is not None else config_value
    if listed is not None and count is not None and len(listed) != count:
        raise ValueError(f"{kind} has {len(listed)} entries but num_{kind} is {count}")
    if count is None:
        count = len(listed) if listed is not None else DEFAULT_NUM_AGENTS
    return count


def resolve_sources(kind: str, shortcut: ModelSource | None, listed: Sequence | None, count: int) -> list:
    """Per-model sources from a homogeneous `shortcut` (e.g. `agent_model`) and/or a list (e.g. `agents`)."""
    shortcut_name = f"{kind[:-1]}_model"  # agents -> agent_model, critics -> critic_model
    if listed is not None:
        if isinstance(listed, (str, os.PathLike, torch.nn.Module)) or not isinstance(listed, Sequence):
            raise ValueError(
                f"{kind} must be a list of model ids, local directories or loaded models, got {type(listed).__name__}"
                + (f" {listed!r}" if isinstance(listed, (str, os.PathLike)) else "")
            )
        if len(listed) != count:
            raise ValueError(f"{kind} has {len(listed)} entries but {count} are expected")
        for i, entry in enumerate(listed):
            if entry is None:
                raise ValueError(f"{kind}[{i}] is None; every entry must be a model id, directory or model")
            if not isinstance(entry, (str, os.PathLike, torch.nn.Module)):
                raise ValueError(f"{kind}[{i}] must be a model id, a local directory or a model, got {type(entry).__name__}")
            check_local_path(f"{kind}[{i}]", entry)
        if shortcut is not None:
            expected = source_name(shortcut)
            for i, entry in enumerate(listed):
                name = source_name(entry)
                if expected is None or name is None:
                    raise ValueError(
                        f"cannot check {kind}[{i}] against {shortcut_name}: a loaded model without a name; "
                        f"pass only {kind}"
                    )
                if not _same_source(name, expected):
                    raise ValueError(f"{shortcut_name}={expected!r} conflicts with {kind}[{i}]={name!r}")
        return list(listed)
    if shortcut is None:
        raise ValueError(f"either {shortcut_name} or {kind} must be provided")
    if isinstance(shortcut, torch.nn.Module):
        if count > 1:
            raise ValueError(
                f"{shortcut_name} is a loaded {type(shortcut).__name__}, which cannot make {count} independent "
                f"{kind}; pass a model id or directory, or {kind}=[...] with one model per entry"
            )
        return [shortcut]
    if not isinstance(shortcut, (str, os.PathLike)):
        raise ValueError(f"{shortcut_name} must be a model id, a local directory or a model, got {type(shortcut).__name__}")
    check_local_path(shortcut_name, shortcut)
    return [os.fspath(shortcut)] * count


def check_local_path(where: str, source: ModelSource) -> None:
    """A source written as a path (absolute, `./`, `../`, `~`, or a path object) must be an existing folder:
    otherwise `from_pretrained` would take it for a Hub id and fail with an unrelated message."""
    if isinstance(source, torch.nn.Module):
        return
    text = os.fspath(source)
    looks_local = isinstance(source, os.PathLike) or os.path.isabs(text) or text.startswith(("./", "../", "~", ".\\"))
    if looks_local and not os.path.isdir(os.path.expanduser(text)):
        state = "is a file, not a model folder" if os.path.exists(text) else "does not exist"
        raise ValueError(f"{where}={text!r} looks like a local path but {state}")


def validate_model_config(model_config: dict | None) -> dict:
    if model_config is not None and not isinstance(model_config, dict):
        raise ValueError(f"model_config must be a dict, got {type(model_config).__name__}: {model_config!r:.100}")
    model_config = dict(model_config or {})
    kwargs = model_config.get("model_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ValueError(f"model_config['model_kwargs'] must be a dict of from_pretrained arguments, got "
                         f"{type(kwargs).__name__}: {kwargs!r:.100}")
    unknown = set(model_config) - _MODEL_CONFIG_KEYS
    if unknown:
        raise ValueError(f"model_config has unknown keys {sorted(unknown)}; allowed: {sorted(_MODEL_CONFIG_KEYS)}")
    if "dtype" in model_config and "torch_dtype" in model_config:
        raise ValueError("model_config sets both 'dtype' and 'torch_dtype'; use 'dtype'")
    return model_config


def load_causal_lm(source: ModelSource, model_config: dict | None = None) -> PreTrainedModel:
    """A loaded model as given, or `AutoModelForCausalLM.from_pretrained(source, ...)`."""
    if isinstance(source, torch.nn.Module):
        return source
    kwargs = load_kwargs(model_config)
    if os.path.isfile(os.path.join(os.fspath(source), "adapter_config.json")):  # a saved LoRA agent: keep training it
        from peft import AutoPeftModelForCausalLM

        return AutoPeftModelForCausalLM.from_pretrained(source, is_trainable=True, **kwargs)
    return AutoModelForCausalLM.from_pretrained(source, **kwargs)


def load_kwargs(model_config: dict | None) -> dict:
    """`from_pretrained` keyword arguments from the trainer's `model_config`."""
    model_config = model_config or {}
    kwargs = dict(model_config.get("model_kwargs") or {})
    dtype = model_config.get("dtype", model_config.get("torch_dtype"))
    if dtype is not None:
        if isinstance(dtype, str) and dtype != "auto":
            if not isinstance(getattr(torch, dtype, None), torch.dtype):
                raise ValueError(f"model_config dtype {dtype!r} is not a torch dtype (e.g. 'float32', 'bfloat16', 'auto')")
            dtype = getattr(torch, dtype)
        kwargs["dtype"] = dtype
    if "attn_implementation" in model_config:
        kwargs["attn_implementation"] = model_config["attn_implementation"]
    return kwargs


def resolve_tokenizers(
    tokenizer: PreTrainedTokenizerBase | Sequence[PreTrainedTokenizerBase] | None,
    sources: Sequence[ModelSource],
    *,
    explicit_required_for_list: bool = False,
    listed: bool = False,
    owner: str = "agents",
) -> list[PreTrainedTokenizerBase]:
    """One tokenizer per model: the shared one, the list entry, or loaded from the model's id/directory."""
    count = len(sources)
    if tokenizer is None:
        if explicit_required_for_list and listed:
            raise ValueError(f"tokenizer must be provided when {owner} is given (one shared tokenizer or a list)")
        cache: dict[str, PreTrainedTokenizerBase] = {}
        out = []
        for i, src in enumerate(sources):
            if isinstance(src, torch.nn.Module):
                raise ValueError(
                    f"tokenizer must be provided when {owner} are model objects ({owner}[{i}] is a "
                    f"{type(src).__name__})"
                )
            key = os.fspath(src)
            if key not in cache:
                cache[key] = AutoTokenizer.from_pretrained(key)
            out.append(cache[key])
        tokenizers = out
    elif isinstance(tokenizer, PreTrainedTokenizerBase):
        tokenizers = [tokenizer] * count
    elif isinstance(tokenizer, Sequence) and not isinstance(tokenizer, str):
        if len(tokenizer) != count:
            raise ValueError(f"tokenizer list has {len(tokenizer)} entries but there are {count} {owner}")
        tokenizers = list(tokenizer)
    else:
        raise ValueError(f"tokenizer must be a tokenizer or a list of tokenizers, got {type(tokenizer).__name__}")
    for i, tok in enumerate(tokenizers):
        if not isinstance(tok, PreTrainedTokenizerBase):
            raise ValueError(f"tokenizer for {owner}[{i}] must be a transformers tokenizer, got {type(tok).__name__}")
        if tok.eos_token_id is None:
            raise ValueError(f"tokenizer for {owner}[{i}] ({type(tok).__name__}) has no eos_token; completions need one")
        if tok.pad_token_id is None:
            # TRL's convention: pad with EOS when the tokenizer has no pad token.
            tok.pad_token = tok.eos_token
    return tokenizers


def check_vocab_fits(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, where: str) -> None:
    """A tokenizer whose ids exceed the model's embedding table is incompatible with it."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is None:
        return
    if len(tokenizer) > embeddings.num_embeddings:
        raise ValueError(
            f"tokenizer for {where} has {len(tokenizer)} tokens but the model's embedding table has "
            f"{embeddings.num_embeddings} rows; the tokenizer does not belong to this model"
        )
