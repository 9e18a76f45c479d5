"""LoRA agents behind one interface: N separate `PeftModel`s, or one frozen base with named adapters.

Backends (`peft_backend=`):

- ``"separate"``: agent i is its own `PeftModel` (its own base weights); any mix of models and tokenizers.
- ``"shared"``: one `PeftModel` on one frozen base holds adapters ``agent_0 .. agent_{N-1}``; agent i is an
  `AdapterAgent`, a thin module over the shared model that activates ``agent_i`` before every forward,
  `generate` and backbone call. N agents cost about one model of memory. Homogeneous agents only.

PEFT pitfalls handled here (see research notes §3): `set_adapter` freezes every other adapter, so every
activation re-enables all of them (a parameter frozen before `backward()` silently gets no gradient); under
activation checkpointing the backward recompute uses the adapter active *then*, so the trainer must run one
forward+backward per agent (it does); `generate(adapter_names=...)` works in eval mode only.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import tempfile
import warnings
from collections.abc import Sequence

import safetensors.torch
import torch
from torch import nn

PEFT_BACKENDS = ("shared", "separate")
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


def adapter_name(index: int) -> str:
    return f"agent_{index}"


def is_peft_model(model) -> bool:
    from peft import PeftModel

    return isinstance(model, (PeftModel, AdapterAgent))


def is_adapter_dir(source) -> bool:
    return isinstance(source, (str, os.PathLike)) and os.path.isfile(os.path.join(os.fspath(source), ADAPTER_CONFIG))


def resolve_peft_configs(peft_config, count: int, owner: str = "agents") -> list | None:
    """None, or one LoRA config per model (copied: PEFT writes into configs). Raises naming the bad value."""
    from peft import LoraConfig, PeftConfig

    if peft_config is None:
        return None
    name = "peft_config" if owner == "agents" else "critic_peft_config"
    listed = isinstance(peft_config, Sequence) and not isinstance(peft_config, (str, bytes))
    if listed:
        configs = list(peft_config)
        if len(configs) != count:
            raise ValueError(f"{name} has {len(configs)} entries but there are {count} {owner}; give one config or one per model")
    else:
        configs = [peft_config] * count
    out = []
    for i, cfg in enumerate(configs):
        where = f"{name}[{i}]" if listed else name
        if not isinstance(cfg, LoraConfig):
            kind = type(cfg).__name__
            hint = " (only LoRA is supported)" if isinstance(cfg, PeftConfig) else ""
            raise ValueError(f"{where} must be a peft.LoraConfig, got {kind}{hint}")
        cfg = copy.deepcopy(cfg)
        task = getattr(cfg.task_type, "value", cfg.task_type)
        if task is None:
            cfg.task_type = "CAUSAL_LM"
        elif task != "CAUSAL_LM":
            raise ValueError(f"{where}.task_type must be CAUSAL_LM (or None), got {task!r}")
        out.append(cfg)
    return out


def choose_backend(requested: str | None, sources: Sequence, tokenizers: Sequence, has_configs: bool) -> str | None:
    """The backend for `sources`: None without PEFT; "shared" by default when every agent names the same
    model (strings) and the tokenizers agree; "separate" otherwise."""
    from ..utils.model_sources import _same_source

    if requested is not None and requested not in PEFT_BACKENDS:
        raise ValueError(f"peft_backend must be one of {PEFT_BACKENDS} or None, got {requested!r}")
    if not has_configs:
        if requested is not None:
            raise ValueError(f"peft_backend={requested!r} needs a peft_config")
        return None
    names = [os.fspath(s) if isinstance(s, (str, os.PathLike)) else None for s in sources]
    homogeneous = all(n is not None and _same_source(n, names[0]) for n in names)
    same_tokenizer = all(t is tokenizers[0] or t.get_vocab() == tokenizers[0].get_vocab() for t in tokenizers)
    if requested == "shared" and not (homogeneous and same_tokenizer):
        raise ValueError(
            "peft_backend='shared' needs homogeneous agents (one model id or directory for all, one vocabulary); "
            f"got agents {[n if n is not None else type(s).__name__ for n, s in zip(names, sources)]}"
        )
    if requested is not None:
        return requested
    return "shared" if homogeneous and same_tokenizer and len(sources) > 1 else "separate"


def check_not_already_peft(models: Sequence, owner: str = "agents") -> None:
    for i, model in enumerate(models):
        if is_peft_model(model) or getattr(model, "_hf_peft_config_loaded", False) or is_adapter_dir(model):
            raise ValueError(
                f"{owner}[{i}] already holds a PEFT adapter ({model if isinstance(model, (str, os.PathLike)) else type(model).__name__}); "
                "pass it without peft_config to keep training that adapter, or pass the base model with peft_config"
            )


@contextlib.contextmanager
def _quiet_peft():
    """PEFT 0.21 reads transformers' deprecated `is_gradient_checkpointing` on every wrap (a FutureWarning the
    user cannot act on)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def _record_base(config, model) -> None:
    if not config.base_model_name_or_path:
        config.base_model_name_or_path = getattr(model, "name_or_path", None) or None


def wrap_separate(model: nn.Module, config) -> nn.Module:
    """One `PeftModel` (adapter "default") around `model`; only the adapter is trainable."""
    from peft import get_peft_model

    _record_base(config, model)
    with _quiet_peft():
        peft_model = get_peft_model(model, config)
    peft_model.enable_input_require_grads()  # reentrant activation checkpointing needs an input that requires grad
    return peft_model


def build_shared(base: nn.Module, configs: Sequence) -> list["AdapterAgent"]:
    """One `PeftModel` on `base` with adapters agent_0..agent_{N-1}, and one `AdapterAgent` view per agent."""
    from peft import get_peft_model

    names = [adapter_name(i) for i in range(len(configs))]
    for cfg in configs:
        _record_base(cfg, base)
    with _quiet_peft():
        peft_model = get_peft_model(base, configs[0], adapter_name=names[0])
    for name, cfg in zip(names[1:], configs[1:]):
        peft_model.add_adapter(name, cfg)
    peft_model.set_requires_grad(names, True)  # add_adapter leaves new adapters frozen
    peft_model.enable_input_require_grads()  # reentrant activation checkpointing needs an input that requires grad
    return [AdapterAgent(peft_model, name, names) for name in names]


class AdapterAgent(nn.Module):
    """Agent `name`'s view of a shared-base `PeftModel`: a causal LM whose every call runs adapter `name`.

    `parameters()` / `named_parameters()` yield only this agent's adapter (and its value head, if any), so
    per-agent optimizer groups and fingerprints see one agent; `state_dict()` is the shared model's.
    `save_pretrained(dir)` writes this adapter alone (PEFT format, base model id in adapter_config.json).
    """

    def __init__(self, peft_model: nn.Module, name: str, all_names: Sequence[str]):
        super().__init__()
        self.peft_model = peft_model
        self.adapter_name = name
        self.all_adapter_names = list(all_names)
        self._marker = f".{name}."

    # ---- adapter switching ----
    def activate(self) -> None:
        """Make this agent's adapter the active one, with every adapter still trainable."""
        model = self.peft_model
        if model.active_adapter != self.adapter_name:
            model.set_adapter(self.adapter_name)
            model.set_requires_grad(self.all_adapter_names, True)

    def forward(self, input_ids=None, attention_mask=None, logits_to_keep: int = 0, **kwargs):
        """The shared model's forward with this agent's adapter (`logits_to_keep` as in transformers: the
        trainer's log-probs skip the prompt's LM-head work)."""
        self.activate()
        if logits_to_keep:
            kwargs["logits_to_keep"] = logits_to_keep
        return self.peft_model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    def generate(self, *args, **kwargs):
        self.activate()
        return self.peft_model.generate(*args, **kwargs)

    def get_base_model(self) -> nn.Module:
        """The transformers model with this agent's adapter active (e.g. for value heads on its backbone)."""
        self.activate()
        return self.peft_model.get_base_model()

    @contextlib.contextmanager
    def disable_adapter(self):
        with self.peft_model.disable_adapter():
            yield

    # ---- what the rest of the code reads from a causal LM ----
    @property
    def config(self):
        return self.peft_model.get_base_model().config

    @property
    def generation_config(self):
        return self.peft_model.get_base_model().generation_config

    @property
    def name_or_path(self) -> str:
        return self.peft_model.get_base_model().name_or_path

    def get_input_embeddings(self):
        return self.peft_model.get_input_embeddings()

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        for name, param in super().named_parameters(prefix, recurse, remove_duplicate):
            rel = name[len(prefix) + 1 :] if prefix else name
            if not rel.startswith("peft_model.") or self._marker in rel:
                yield name, param

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None, **kwargs):
        _enable_checkpointing(self.peft_model, activation_checkpointing_kwargs, **kwargs)

    def activation_checkpointing_disable(self):
        _disable_checkpointing(self.peft_model)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None, **kwargs):
        _enable_checkpointing(self.peft_model, gradient_checkpointing_kwargs)

    def gradient_checkpointing_disable(self):
        _disable_checkpointing(self.peft_model)

    # ---- saving ----
    def save_pretrained(self, save_directory, state_dict=None, **kwargs) -> None:
        """This agent's adapter only (`adapter_model.safetensors`, `adapter_config.json`); `state_dict` is ignored."""
        save_directory = os.fspath(save_directory)
        os.makedirs(save_directory, exist_ok=True)
        parent = tempfile.mkdtemp(prefix=".adapter-", dir=save_directory)
        try:  # PEFT writes a named adapter into <dir>/<name>/
            self.peft_model.save_pretrained(parent, selected_adapters=[self.adapter_name])
            written = os.path.join(parent, self.adapter_name)
            for entry in os.listdir(written):
                shutil.move(os.path.join(written, entry), os.path.join(save_directory, entry))
        finally:
            shutil.rmtree(parent, ignore_errors=True)


def _enable_checkpointing(peft_model, kwargs=None, **extra) -> None:
    base = peft_model.get_base_model()
    if hasattr(base, "activation_checkpointing_enable"):
        base.activation_checkpointing_enable(kwargs, **extra)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _disable_checkpointing(peft_model) -> None:
    base = peft_model.get_base_model()
    if hasattr(base, "activation_checkpointing_disable"):
        base.activation_checkpointing_disable()
    else:
        base.gradient_checkpointing_disable()


class AdaptersOff(nn.Module):
    """The reference policy of LoRA agents: the frozen base with adapters disabled, in eval mode (no copy).
    One instance serves every agent of a shared base."""

    def __init__(self, peft_model: nn.Module):
        super().__init__()
        object.__setattr__(self, "_peft", peft_model)  # not a submodule: no parameters of its own

    def forward(self, *args, **kwargs):
        model = self._peft
        was_training = model.training
        model.eval()
        try:
            with model.disable_adapter():
                return model(*args, **kwargs)
        finally:
            model.train(was_training)


def reference_for(agents: Sequence[nn.Module]) -> list[nn.Module] | None:
    """Adapters-off references for PEFT agents (one shared instance per shared base), else None."""
    if not agents or not all(is_peft_model(a) for a in agents):
        return None
    cache: dict[int, AdaptersOff] = {}
    out = []
    for agent in agents:
        peft = agent.peft_model if isinstance(agent, AdapterAgent) else agent
        out.append(cache.setdefault(id(peft), AdaptersOff(peft)))
    return out


def adapter_settings(model: nn.Module) -> dict | None:
    """The LoRA settings of a model's adapter that change its math (None for a model without PEFT)."""
    if not is_peft_model(model):
        return None
    peft = model.peft_model if isinstance(model, AdapterAgent) else model
    config = peft.peft_config[model.adapter_name if isinstance(model, AdapterAgent) else peft.active_adapter]
    keys = ("r", "lora_alpha", "lora_dropout", "bias", "use_rslora", "use_dora", "fan_in_fan_out")
    out = {k: getattr(config, k, None) for k in keys}
    modules = config.target_modules
    out["target_modules"] = sorted(modules) if isinstance(modules, (set, list, tuple)) else modules
    return out


# ---- loading and merging ----
def load_adapter_folder(model: nn.Module, folder: str) -> None:
    """Load `folder/adapter_model.safetensors` into the live adapter of `model`, in place (bit-exact)."""
    from peft import set_peft_model_state_dict

    path = os.path.join(folder, ADAPTER_WEIGHTS)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} is missing")
    peft = model.peft_model if isinstance(model, AdapterAgent) else model
    name = model.adapter_name if isinstance(model, AdapterAgent) else peft.active_adapter
    state = safetensors.torch.load_file(path)
    result = set_peft_model_state_dict(peft, state, adapter_name=name)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise ValueError(f"{folder} does not fit agent adapter {name!r}: unexpected {sorted(unexpected)[:5]}")
    if isinstance(model, AdapterAgent):
        model.activate()
        peft.set_requires_grad(model.all_adapter_names, True)


def merged_copy(model: nn.Module) -> nn.Module:
    """A plain transformers model with this agent's adapter merged in (the live model is untouched)."""
    if isinstance(model, AdapterAgent):
        peft = copy.deepcopy(model.peft_model)
        peft.set_adapter(model.adapter_name)
        merged = peft.merge_and_unload(adapter_names=[model.adapter_name])
    else:
        merged = copy.deepcopy(model).merge_and_unload()
    head = getattr(model, "value_head", None)
    if head is not None:
        merged.value_head = copy.deepcopy(head)
    return merged
