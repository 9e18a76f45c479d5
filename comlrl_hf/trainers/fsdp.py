"""FSDP2 (`torch.distributed.fsdp.fully_shard`) for `MultiAgentTrainer`, the MAGRPO family only.

Design (docs/scaling.md):

- **Each agent is sharded on its own**: `fully_shard` on every decoder layer, then on the agent. Accelerate's
  FSDP path would shard the whole container as one root, whose root group (every agent's embeddings and heads)
  is only gathered by the container's forward, while agents also run `generate` and forward on their own.
  So the trainer shards the agents itself and hides FSDP from accelerate (which then sees plain multi-process
  training; on CPU accelerate 1.15 ignores its FSDP plugin anyway and wraps the model in DDP).
- **Gradients**: FSDP reduce-scatters (averages) each agent's gradients at its backward, so the manual
  all-reduce of `DataParallelMixin` is skipped. Clipping stays per agent, on the sharded (DTensor) gradients.
- **Generation**: an agent is unsharded for its `generate` calls and kept unsharded across the decode loop
  (`set_reshard_after_forward(False)`), so generation runs no collective and processes may decode different
  numbers of tokens; it is resharded afterwards (as TRL gathers ZeRO-3 weights for generation).
- **Checkpoints** hold full (gathered) state dicts in the usual layout: `agent_i/` safetensors, loadable
  without FSDP, and `optimizer.pt` in `torch.optim.Optimizer.state_dict()` form. Every process joins the gather;
  process 0 writes. Resume loads them back into the sharded parameters.

Every process must run the same number of forward passes per agent (each one all-gathers the agent's layers):
settings that make that count depend on the data (early termination) are refused.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist

from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "false").lower() in ("1", "true", "yes")


def fsdp_requested(args) -> bool:
    """`accelerate launch` with an FSDP config sets ACCELERATE_USE_FSDP; `TrainingArguments(fsdp=...)` sets args.fsdp."""
    return bool(getattr(args, "fsdp", None)) or _env_flag("ACCELERATE_USE_FSDP")


def fsdp_settings(args) -> dict:
    """The FSDP settings of this launch, checked; a ValueError names any setting this trainer does not implement."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import CPUOffloadPolicy

    plugin_args = getattr(args, "fsdp_plugin_args", None)
    plugin = FullyShardedDataParallelPlugin(**plugin_args) if plugin_args else FullyShardedDataParallelPlugin()
    if plugin.fsdp_version != 2:
        raise ValueError(f"FSDP version {plugin.fsdp_version} is not supported; use FSDP2 (fsdp_version: 2)")
    if isinstance(plugin.cpu_offload, CPUOffloadPolicy) or plugin.cpu_offload is True:
        raise ValueError("FSDP parameter offloading (fsdp_offload_params: true) is not supported; set it to false")
    if plugin.activation_checkpointing:
        raise ValueError(
            "FSDP's activation checkpointing (fsdp_activation_checkpointing: true) is not supported; set it to false "
            "and use gradient_checkpointing=True"
        )
    state_dict_type = getattr(plugin.state_dict_type, "name", str(plugin.state_dict_type))
    if state_dict_type != "FULL_STATE_DICT":
        raise ValueError(
            f"FSDP state_dict_type {state_dict_type} is not supported; checkpoints hold full state dicts "
            "(fsdp_state_dict_type: FULL_STATE_DICT)"
        )
    if plugin.cpu_ram_efficient_loading or _env_flag("FSDP_CPU_RAM_EFFICIENT_LOADING"):
        raise ValueError(
            "fsdp_cpu_ram_efficient_loading: true is not supported (processes other than 0 would load agents "
            "without weights); set it to false"
        )
    # unset (None) or TRANSFORMER_BASED_WRAP: agents are always sharded per decoder layer
    policy = getattr(plugin.auto_wrap_policy, "__name__", repr(plugin.auto_wrap_policy))
    if plugin.auto_wrap_policy is not None and policy != "transformer_auto_wrap_policy":
        raise ValueError(
            f"FSDP auto_wrap_policy {policy} is not supported; agents are sharded per decoder layer "
            "(fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP)"
        )
    return {
        "reshard_after_forward": bool(plugin.reshard_after_forward),
        "layer_classes": list(plugin.transformer_cls_names_to_wrap or []),
    }


def _is_dtensor(tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's global value (e.g. a gradient norm); other tensors unchanged."""
    return tensor.full_tensor() if _is_dtensor(tensor) else tensor


def shard_agent(agent: torch.nn.Module, layer_classes: list[str], reshard_after_forward: bool) -> None:
    """`fully_shard` every decoder layer (the classes the model lists in `_no_split_modules`, or those named in
    the FSDP config), then the agent itself (embeddings, norm, head: its root group)."""
    from torch.distributed.fsdp import fully_shard

    names = set(layer_classes or getattr(agent, "_no_split_modules", None) or [])
    layers = [m for m in agent.modules() if type(m).__name__ in names and m is not agent]
    if not layers:
        raise ValueError(
            f"{type(agent).__name__} has no module of the layer classes {sorted(names)} to shard; name its decoder "
            "layer class in fsdp_transformer_layer_cls_to_wrap"
        )
    for layer in layers:
        fully_shard(layer, reshard_after_forward=reshard_after_forward)
    fully_shard(agent, reshard_after_forward=reshard_after_forward)


def _inner_optimizer(optimizer):
    return getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps the torch one


def _indexed(optim_state: dict) -> dict:
    """A DCP optimizer state dict (parameters named by FQN) in `Optimizer.state_dict()` form (parameters
    numbered in group order), the layout of a checkpoint written without FSDP."""
    index, groups = {}, []
    for group in optim_state["param_groups"]:
        ids = []
        for fqn in group["params"]:
            index.setdefault(fqn, len(index))
            ids.append(index[fqn])
        groups.append({**group, "params": ids})
    return {"state": {index[fqn]: value for fqn, value in optim_state["state"].items()}, "param_groups": groups}


def _named(indexed: dict, template: dict) -> dict:
    """The inverse of `_indexed`, with the FQNs of this run's optimizer (`template`: its DCP state dict)."""
    fqns = [fqn for group in template["param_groups"] for fqn in group["params"]]
    groups = [{**saved, "params": [fqns[i] for i in saved["params"]]} for saved in indexed["param_groups"]]
    return {"state": {fqns[int(i)]: value for i, value in indexed["state"].items()}, "param_groups": groups}


class FullyShardedMixin:
    """Mixed into `MultiAgentTrainer` before `CheckpointMixin` and `DataParallelMixin`. Inert without FSDP."""

    _fsdp_settings: dict | None = None
    _fsdp_full_state: dict | None = None  # gathered by every process for the checkpoint process 0 writes

    @property
    def _fsdp(self) -> bool:
        return self._fsdp_settings is not None

    def _check_fsdp(self, args, peft_config) -> None:
        """Before any model is loaded: is FSDP asked for, and can this run use it."""
        if not fsdp_requested(args):
            return
        if args.deepspeed:
            raise ValueError("DeepSpeed and FSDP are both configured; choose one")
        if not getattr(self, "supports_fully_sharded", False):
            raise ValueError(f"FSDP is not supported by {type(self).__name__} yet (supported: the MAGRPO family)")
        if peft_config is not None:
            raise ValueError("FSDP with peft_config (LoRA agents) is not supported yet; train full agents or drop FSDP")
        if args.early_termination_threshold is not None:  # processes would run different numbers of forwards
            raise ValueError(
                f"FSDP with early_termination_threshold={args.early_termination_threshold} is not supported: every "
                "process must run the same number of forward passes; set it to None"
            )
        settings = fsdp_settings(args)
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("FSDP needs a distributed launch (accelerate launch or torchrun), even for one process")
        self._fsdp_settings = settings

    def create_accelerator_and_postprocess(self):
        """Build the accelerator without FSDP: the agents are sharded here instead (module docstring)."""
        if not self._fsdp:
            return super().create_accelerator_and_postprocess()
        saved_args, saved_env = self.args.fsdp_plugin_args, os.environ.pop("ACCELERATE_USE_FSDP", None)
        self.args.fsdp_plugin_args = None
        try:
            return super().create_accelerator_and_postprocess()
        finally:
            self.args.fsdp_plugin_args = saved_args
            if saved_env is not None:
                os.environ["ACCELERATE_USE_FSDP"] = saved_env

    def _shard_agents(self) -> None:
        if not self._fsdp:
            return
        for agent in self.agents:
            shard_agent(agent, self._fsdp_settings["layer_classes"], self._fsdp_settings["reshard_after_forward"])

    @contextlib.contextmanager
    def gathered_for_generation(self, agent_index: int):
        """The agent's full parameters on this process for the duration (no collective inside)."""
        if not self._fsdp:
            yield
            return
        agent = self.agents[agent_index]
        agent.unshard()
        agent.set_reshard_after_forward(False)  # also on every layer: the decode loop then gathers nothing
        try:
            yield
        finally:
            agent.set_reshard_after_forward(self._fsdp_settings["reshard_after_forward"])
            # reshard() is not recursive: the decode loop left every layer whole, free each group's full weights
            from torch.distributed.fsdp import FSDPModule

            for module in agent.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()

    def _wrap_model(self, model, training: bool = True, dataloader=None):
        """Never DDP around sharded agents (accelerate would wrap even one process): device placement and mixed
        precision only, as `DataParallelMixin` does."""
        if not self._fsdp:
            return super()._wrap_model(model, training=training, dataloader=dataloader)
        if not getattr(model, "_is_accelerate_prepared", False):
            model = self.accelerator.prepare_model(model, evaluation_mode=True)
        return model

    # ---- gradients ----
    def all_reduce_gradients(self) -> None:
        if not self._fsdp:
            return super().all_reduce_gradients()
        unsharded = [p for g in self.optimizer.param_groups for p in g["params"] if p.requires_grad and not _is_dtensor(p)]
        if unsharded:  # every trainable parameter belongs to a sharded agent; anything else is a bug here
            raise RuntimeError(f"{len(unsharded)} trainable parameters are not sharded by FSDP")

    # ---- checkpoints: full state dicts, gathered by every process ----
    def _gather_full_state(self) -> dict:
        """Every agent's full state dict and the full optimizer state, on process 0 (empty elsewhere). A
        collective: every process calls it, in the same order."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = {"agents": [get_model_state_dict(agent, options=options) for agent in self.agents], "optimizer": None}
        if self.optimizer is not None:
            optim = get_optimizer_state_dict(self._container, _inner_optimizer(self.optimizer), options=options)
            state["optimizer"] = _indexed(optim) if optim else None
        return state

    @contextlib.contextmanager
    def _full_state_gathered(self):
        """Every agent's full state (and the optimizer's) gathered for the writes inside; a collective."""
        self._fsdp_full_state = self._gather_full_state()
        try:
            yield
        finally:
            self._fsdp_full_state = None

    def _save_checkpoint(self, model, trial) -> None:
        if not self._fsdp:
            return super()._save_checkpoint(model, trial)
        with self._full_state_gathered():
            return super()._save_checkpoint(model, trial)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Under FSDP every process must call it (the weights are gathered); process 0 writes."""
        if not self._fsdp or self._fsdp_full_state is not None:  # inside a checkpoint: already gathered
            return super().save_model(output_dir, _internal_call)
        with self._full_state_gathered():
            return super().save_model(output_dir, _internal_call)

    def _agent_state_dicts(self) -> list[dict] | None:
        """What `_save` writes for each agent: the gathered full state dicts under FSDP (None: the live agents)."""
        return self._fsdp_full_state["agents"] if self._fsdp and self._fsdp_full_state is not None else None

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        if not self._fsdp:
            return super()._save_optimizer_and_scheduler(output_dir)
        if self.args.should_save:
            torch.save(self._fsdp_full_state["optimizer"], os.path.join(output_dir, OPTIMIZER_NAME))
            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))

    def _load_agent_weights(self, path: str) -> None:
        if not self._fsdp:
            return super()._load_agent_weights(path)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        from ..models.multi_agent import agent_dir, read_folder_state

        for i, agent in enumerate(self.agents):  # every process reads the full files and keeps its shards
            state = read_folder_state(agent, agent_dir(path, i))
            set_model_state_dict(agent, state, options=StateDictOptions(full_state_dict=True, strict=False))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if not self._fsdp or checkpoint is None:
            return super()._load_optimizer_and_scheduler(checkpoint)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict, set_optimizer_state_dict

        path = os.path.join(checkpoint, OPTIMIZER_NAME)
        if not os.path.isfile(path):
            return
        optimizer = _inner_optimizer(self.optimizer)
        saved = torch.load(path, map_location="cpu", weights_only=True)
        template = get_optimizer_state_dict(self._container, optimizer)  # this run's parameter names, in order
        set_optimizer_state_dict(self._container, optimizer, _named(saved, template),
                                 options=StateDictOptions(full_state_dict=True))
        self.lr_scheduler.load_state_dict(torch.load(os.path.join(checkpoint, SCHEDULER_NAME), weights_only=True))
