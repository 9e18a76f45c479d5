"""`MultiAgentTrainer`: `transformers.Trainer` for N cooperating language-model agents.

Trainer keeps the loop, accelerate, precision, gradient accumulation, schedulers, callbacks and reporting.
This class overrides only what N agents need: building the agents, the prompt dataloader, per-agent
optimizer groups and gradient clipping, a per-agent forward+backward `training_step`, logging keyed on
`env_step`, and saving the `agent_i/` layout. Algorithms implement `rollout()` and `agent_loss()`.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler
from transformers import PreTrainedTokenizerBase, Trainer

from ..models.multi_agent import MultiAgentModel
from ..utils._trl_compat import disable_dropout_in_model
from ..utils.model_sources import (
    check_vocab_fits,
    resolve_count,
    resolve_sources,
    resolve_tokenizers,
    validate_model_config,
)
from .checkpointing import CheckpointMixin
from .episodes import EpisodeMixin
from .hub import HubMixin
from .peft_support import PeftMixin
from .config import MultiAgentConfig
from .distributed import DataParallelMixin
from .placement import PlacementMixin
from .fsdp import FullyShardedMixin, full_tensor
from .wandb_callback import MultiAgentWandbCallback, validate_wandb_config


def _identity_collate(items: list) -> list:
    return items


class PromptBatchSampler(Sampler[list[int]]):
    """Batches of dataset indices, reshuffled per epoch from `seed + epoch` (so a resumed run sees the same
    order), with each group of `group_size` batches repeated `repeats` times when a rollout is reused.

    With `world_size` W > 1 (data-parallel), the order is cut into global batches of W x `batch_size` prompts and
    each global batch into W consecutive per-process batches, yielded in turn: accelerate's `BatchSamplerShard`
    then hands process r the r-th slice of every global batch, which is the one-process batch of W x
    `batch_size` prompts split in order. A last global batch that cannot give every process `batch_size`
    prompts is dropped (as TRL does), and `group_size` counts per-process batches."""

    def __init__(self, num_items: int, batch_size: int, *, shuffle: bool, seed: int, group_size: int = 1, repeats: int = 1,
                 world_size: int = 1):
        self.num_items, self.batch_size, self.shuffle, self.seed = num_items, batch_size, shuffle, seed
        self.group_size, self.repeats, self.epoch = group_size, repeats, 0
        self.world_size = world_size

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _batches(self) -> list[list[int]]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_items, generator=generator).tolist()
        else:
            order = list(range(self.num_items))
        if self.world_size > 1:
            usable = self.num_items // (self.batch_size * self.world_size) * self.batch_size * self.world_size
            return [order[i : i + self.batch_size] for i in range(0, usable, self.batch_size)]
        return [order[i : i + self.batch_size] for i in range(0, self.num_items, self.batch_size)]

    def __iter__(self):
        batches = self._batches()
        size = self.group_size * self.world_size
        for start in range(0, len(batches), size):
            group = batches[start : start + size]
            for _ in range(self.repeats):
                yield from group

    def batches_per_process(self) -> int:
        if self.world_size > 1:
            return self.num_items // (self.batch_size * self.world_size)
        return math.ceil(self.num_items / self.batch_size)

    def __len__(self) -> int:
        return self.batches_per_process() * self.world_size * self.repeats


class _IndexedDataset(torch.utils.data.Dataset):
    """Yields (index, item): the dataset index seeds a prompt's generation (`seed_generation_per_prompt`)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        return index, self.dataset[index]


def check_dataset(name: str, dataset, needs_prompt: bool) -> None:
    """An empty dataset, or one without the `prompt` field the default formatter reads, fails at construction
    (not at the first rollout)."""
    if dataset is None:
        return
    if isinstance(dataset, dict) or not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise ValueError(
            f"{name} must be one dataset with len() and indexing (e.g. a datasets.Dataset), got {type(dataset).__name__}"
        )
    if len(dataset) == 0:
        raise ValueError(f"{name} is empty ({type(dataset).__name__} with 0 rows)")
    # Only a dataset that declares its columns is checked here: reading a row could change a stateful dataset
    # (others fail at their first rollout, in the default formatter, with the row in the message).
    columns = getattr(dataset, "column_names", None)
    if needs_prompt and isinstance(columns, (list, tuple)) and "prompt" not in columns:
        raise ValueError(f"{name} has no 'prompt' column (columns: {sorted(columns)}); add one or pass formatters=")


def check_devices(models: dict[str, torch.nn.Module], trainer_device, placed: bool = False) -> None:
    """Every model on one real device. Unless `placed` (`agent_devices` moved each agent to its own device), every
    agent on the same one: the trainer moves them all to `args.device`, so agents the user placed on different
    devices would be silently moved."""
    placements = {}
    for where, model in models.items():
        devices = {p.device for p in model.parameters()}
        if any(d.type == "meta" for d in devices):
            raise ValueError(f"{where} has parameters on the meta device (no weights loaded); load it with real weights")
        if len(devices) > 1:
            raise ValueError(f"{where} is spread over devices {sorted(map(str, devices))}; each model must be on one device")
        if devices:
            placements[where] = next(iter(devices))
    if not placed and len(set(placements.values())) > 1:
        listed = ", ".join(f"{where} on {device}" for where, device in placements.items())
        raise ValueError(
            f"the agents are on different devices ({listed}); put them on one device (the trainer moves every "
            f"agent to args.device, here {trainer_device}), or name each agent's device in agent_devices"
        )


class MultiAgentTrainer(HubMixin, PeftMixin, EpisodeMixin, FullyShardedMixin, CheckpointMixin, PlacementMixin,
                         DataParallelMixin, Trainer):
    """Base class of every comlrl_hf trainer. Subclasses set `config_class` and implement
    `rollout(batch) -> inputs` and `agent_loss(agent_index, inputs) -> loss`."""

    config_class: type[MultiAgentConfig] = MultiAgentConfig
    algorithm_name = "MultiAgent"
    # IAC/MAAC: when `agents` is a list, the tokenizer must be given explicitly (spec §1.3).
    explicit_tokenizer_for_agent_list = False
    # The rollouts, the loss normalisation and the division by gradient-accumulation steps are ours.
    loss_is_scaled_for_ga = True
    # Data-parallel training (one process per device) is tested for this trainer (tests/test_ddp.py).
    supports_data_parallel = False
    # FSDP2, each agent sharded on its own (fsdp.py; tests/test_fsdp.py).
    supports_fully_sharded = False

    def __init__(
        self,
        agent_model: str | os.PathLike | torch.nn.Module | None = None,
        agents: Sequence[str | os.PathLike | torch.nn.Module] | None = None,
        num_agents: int | None = None,
        tokenizer: PreTrainedTokenizerBase | Sequence[PreTrainedTokenizerBase] | None = None,
        model_config: dict | None = None,
        train_dataset=None,
        eval_dataset=None,
        reward_func: Callable | None = None,
        reward_processor: Callable | None = None,
        formatters=None,
        external_transition: Callable | None = None,
        wandb_config: dict | None = None,
        eval_logger: Callable | None = None,
        eval_aggregator: Callable | None = None,
        args: MultiAgentConfig | None = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        peft_config=None,
        peft_backend: str | None = None,
    ):
        self._peft_args = (peft_config, peft_backend)
        self._user_callables = dict(
            reward_func=reward_func, reward_processor=reward_processor, formatters=formatters,
            external_transition=external_transition, eval_logger=eval_logger, eval_aggregator=eval_aggregator,
        )
        if args is None:
            args = self.config_class(output_dir=f"{self.algorithm_name}-output")
        elif not isinstance(args, self.config_class):
            raise ValueError(
                f"{type(self).__name__} needs args of type {self.config_class.__name__}, got {type(args).__name__}"
            )
        wandb_config = validate_wandb_config(wandb_config)
        if args.world_size > 1:
            if not self.supports_data_parallel:
                raise ValueError(
                    f"distributed training (world_size={args.world_size}) is not supported by {type(self).__name__} "
                    "(it sets supports_data_parallel = False); run one process"
                )
        if args.deepspeed or os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
            raise ValueError(
                "DeepSpeed is not supported yet (untested); use FSDP2 (examples/accelerate/fsdp2.yaml) or plain "
                "multi-process data parallelism (examples/accelerate/multi_gpu.yaml)"
            )
        self._check_fsdp(args, peft_config)  # FSDP2 asked for: supported here, with these settings?
        count = resolve_count("agents", num_agents, args.num_agents, agents)
        self._resolve_agent_placement(args, count)  # with agent_devices, one process drives the GPUs: n_gpu is 1
        if args.n_gpu > 1:  # Trainer would wrap the container in nn.DataParallel, which cannot route agents
            raise ValueError(
                f"{args.n_gpu} GPUs are visible to one process (nn.DataParallel), which comlrl_hf does not support; "
                "launch one process per GPU with `accelerate launch`/`torchrun`, set agent_devices, or set "
                "CUDA_VISIBLE_DEVICES"
            )
        sources = resolve_sources("agents", agent_model, agents, count)
        self.model_config = validate_model_config(model_config)
        tokenizers = resolve_tokenizers(
            tokenizer, sources, explicit_required_for_list=self.explicit_tokenizer_for_agent_list, listed=agents is not None
        )
        self._setup_episodes(args, count)
        for name, dataset in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
            check_dataset(name, dataset, needs_prompt=formatters is None)
        self._validate_before_loading(args, count)
        models = self._load_agent_models(sources, tokenizers, args.seed)  # LoRA-wrapped when peft_config is given
        seen: set[int] = set()
        for i, (model, tok) in enumerate(zip(models, tokenizers)):
            if id(model) in seen:
                raise ValueError(f"agents[{i}] is the same model object as an earlier agent; pass one model per agent")
            seen.add(id(model))
            check_vocab_fits(model, tok, f"agents[{i}]")
        check_devices({f"agents[{i}]": model for i, model in enumerate(models)}, args.device, self._agent_devices is not None)
        self._place(models, self.agent_device)  # after the meta-device check: meta weights cannot be moved
        args.num_agents = count
        critics, layout = self._build_critics(models, tokenizers, args)
        self._place(critics or [], self.critic_device)
        if args.disable_dropout:
            for model in models + list(critics or []):
                disable_dropout_in_model(model)
        container = MultiAgentModel(models, tokenizers, critics, layout)
        self.env_step = 0  # joint actions scored so far: the x-axis of every logged metric
        self._metrics: dict[str, list[float]] = defaultdict(list)
        self._agent_grad_norms: dict[str, float] | None = None
        self._rollout_cache: list[Any] = []
        self._micro_step = 0
        self.wandb_identity: dict | None = None  # {"id", "project", "entity"} once a W&B run is open
        super().__init__(
            model=container,
            args=args,
            data_collator=_identity_collate,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=None,
            callbacks=callbacks,
            optimizers=optimizers,
        )
        if self.placement_active:  # the Trainer must neither move the container nor wrap it in nn.DataParallel
            self.is_model_parallel = True
        self._setup_wandb(wandb_config)
        if self._distributed:  # one sampling stream per process (TRL: set_seed(seed, device_specific=True))
            from accelerate.utils import set_seed

            set_seed(self.args.seed, device_specific=True)
        self._broadcast_parameters([self.model])  # N processes start from process 0's agents and critics
        # The KL reference, only when the KL term is on: frozen copies, or the base with adapters off under LoRA.
        self.ref_agents = self._reference_models() if self.args.beta > 0 else None
        self._shard_agents()  # FSDP2: after the reference copies (kept whole on every process), before the optimizer
        self._last_samples: list[dict] = []

    def _setup_wandb(self, wandb_config: dict | None) -> None:
        """`wandb_config` turns W&B on; `report_to=["wandb"]` alone works too. Either way the run is opened at
        the first train/log (never here) and metrics are logged against `env_step`."""
        from transformers.integrations import WandbCallback

        existing = [c for c in self.callback_handler.callbacks if isinstance(c, WandbCallback)]
        if wandb_config is None and not existing:
            return
        for callback in existing:
            self.remove_callback(callback)
        self.add_callback(MultiAgentWandbCallback(self, wandb_config))

    def _build_critics(self, agents: list, tokenizers: list, args) -> tuple[list | None, str | None]:
        """Critics (and value heads) of actor-critic trainers: (critics, critic_layout)."""
        return None, None

    def _validate_before_loading(self, args: MultiAgentConfig, num_agents: int) -> None:
        """Algorithm checks that need no model; raised before any weights are loaded."""

    # ---- the agents ----
    @property
    def agents(self) -> torch.nn.ModuleList:
        return self._container.agents

    @property
    def tokenizers(self) -> list[PreTrainedTokenizerBase]:
        return self._container.tokenizers

    @property
    def num_agents(self) -> int:
        return self._container.num_agents

    @property
    def _container(self) -> MultiAgentModel:
        return self.accelerator.unwrap_model(self.model) if hasattr(self, "accelerator") else self.model

    # ---- data ----
    def get_train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            raise ValueError(f"{type(self).__name__}.train() needs a train_dataset")
        num_items = len(self.train_dataset)
        if num_items == 0:
            raise ValueError("train_dataset is empty")
        batch_size = self.args.per_device_train_batch_size
        group = self.args.gradient_accumulation_steps
        repeats = self.rollout_reuse_count()
        world = self.args.world_size
        sampler = PromptBatchSampler(
            num_items, batch_size, shuffle=self.args.shuffle_dataset, seed=self.args.seed, group_size=group, repeats=repeats,
            world_size=world,
        )
        num_batches = sampler.batches_per_process()
        if num_batches == 0:
            raise ValueError(
                f"train_dataset has {num_items} prompts, fewer than one global batch of {world} processes x "
                f"per_device_train_batch_size={batch_size}"
            )
        if repeats > 1 and num_batches % group:
            raise ValueError(
                f"reusing rollouts ({repeats} times) needs the {num_batches} batches per epoch to divide into "
                f"gradient_accumulation_steps={group}; change per_device_train_batch_size or the dataset size"
            )
        dataset = _IndexedDataset(self.train_dataset) if self.args.seed_generation_per_prompt else self.train_dataset
        loader = DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=_identity_collate,
            num_workers=self.args.dataloader_num_workers,
        )
        return self.accelerator.prepare(loader)

    # ---- optimization ----
    def create_optimizer(self, model=None):
        """One parameter group per agent (`agent_i`, and `agent_i/no_decay` for biases and norms when
        weight decay is on) at `agent_learning_rate`, and per critic (`critic_i`, `critic`, or
        `agent_i/value_head` on a shared backbone) at `critic_learning_rate`. AdamW is per-parameter, so this
        equals one optimizer per model."""
        if self.optimizer is not None:
            return self.optimizer
        critic_rate = self.args.critic_learning_rate if self.args.critic_learning_rate is not None else self.args.agent_learning_rate
        sets = []  # (group name, module, parameter filter, learning rate)
        for i, agent in enumerate(self.agents):
            sets.append((f"agent_{i}", agent, lambda n: not n.startswith("value_head."), self.args.agent_learning_rate))
            if getattr(agent, "value_head", None) is not None:  # shared actor-critic backbone
                sets.append((f"agent_{i}/value_head", agent, lambda n: n.startswith("value_head."), critic_rate))
        critics = self._container.critics or []
        for i, critic in enumerate(critics):
            sets.append(("critic" if len(critics) == 1 and self._container.critic_layout == "central" else f"critic_{i}",
                         critic, lambda n: True, critic_rate))
        groups = []
        for name, module, keep, rate in sets:
            decay = set(self.get_decay_parameter_names(module))
            params = [(n, p) for n, p in module.named_parameters() if p.requires_grad and keep(n)]
            if self.args.weight_decay:
                groups.append({"name": name, "params": [p for n, p in params if n in decay], "lr": rate,
                               "weight_decay": self.args.weight_decay})
                groups.append({"name": f"{name}/no_decay", "params": [p for n, p in params if n not in decay],
                               "lr": rate, "weight_decay": 0.0})
            else:
                groups.append({"name": name, "params": [p for _, p in params], "lr": rate, "weight_decay": 0.0})
        groups = [g for g in groups if g["params"]]
        optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, self.model)
        self.optimizer = optimizer_cls(groups, **optimizer_kwargs)
        return self.optimizer

    def _agent_of_group(self, group: dict) -> str:
        return group.get("name", "").split("/")[0]

    def _clip_grad_norm(self, model):
        """Clip each agent's gradients to `max_grad_norm` on its own (the default clips all agents jointly,
        so one agent's large gradient would shrink the others'). Returns the norm over all agents."""
        self.accelerator.unscale_gradients()
        per_agent: dict[str, list[torch.Tensor]] = defaultdict(list)
        for group in self.optimizer.param_groups:
            per_agent[self._agent_of_group(group)].extend(p for p in group["params"] if p.grad is not None)
        # under FSDP the gradients are DTensor shards and each norm is the agent's global norm
        norms = [full_tensor(torch.nn.utils.clip_grad_norm_(params, self.args.max_grad_norm)) for params in per_agent.values()]
        self._agent_grad_norms = {name: norm.item() for name, norm in zip(per_agent, norms)}
        # each agent's norm is on its own device (agent_devices): combine them on the trainer's
        return torch.linalg.vector_norm(torch.stack([n.to(self.args.device) for n in norms])) if norms else torch.tensor(0.0)

    # ---- one step ----
    def rollout(self, batch: list[dict]) -> Any:
        raise NotImplementedError

    def agent_loss(self, agent_index: int, inputs: Any) -> torch.Tensor:
        raise NotImplementedError

    def _inputs_for_step(self, batch: list[dict]) -> Any:
        """A fresh rollout, or the buffered one when rollouts are reused (`rollout_reuse_count() > 1`)."""
        group = self.args.gradient_accumulation_steps
        cycle = self._micro_step % (group * self.rollout_reuse_count())
        slot = cycle % group
        if cycle < group:
            inputs = self.rollout(batch)
            if slot < len(self._rollout_cache):
                self._rollout_cache[slot] = inputs
            else:
                self._rollout_cache.append(inputs)
        self._micro_step += 1
        return self._rollout_cache[slot]

    def training_step(self, model, inputs, num_items_in_batch=None) -> torch.Tensor:
        """Rollout, then forward+backward one agent at a time: one agent's activations live at a time, and
        activation checkpointing stays correct when agents share modules."""
        model.train()
        if callable(getattr(self.optimizer, "train", None)):  # schedule-free optimizers switch modes
            self.optimizer.train()
        if self.args.seed_generation_per_prompt:  # (dataset index, item) pairs, see get_train_dataloader
            self._prompt_indices = [index for index, _ in inputs]
            inputs = [item for _, item in inputs]
        env_before = self.env_step
        try:
            rollout = self._inputs_for_step(inputs)
        finally:
            self._prompt_indices = None
        if self._distributed:  # every process counted its own joint actions; losses weigh by global rows
            self.env_step = env_before + self._reduce_step_counts(self.env_step - env_before, self.loss_weights(rollout))
        total = torch.zeros((), device=self.args.device)
        # `loss_chunk_size`: the policy loss runs its own backward per chunk of rows through this
        self._chunk_backward = lambda part: self.accelerator.backward(part / self.current_gradient_accumulation_steps)
        try:
            for i in range(self.num_agents):
                self._policy_loss_streamed = False
                with self.compute_loss_context_manager():
                    loss = self.agent_loss(i, rollout)
                if not torch.isfinite(loss):
                    raise FloatingPointError(
                        f"agent {i} produced a non-finite loss ({loss.item()}) at step {self.state.global_step}"
                    )
                loss = loss / self.current_gradient_accumulation_steps
                if loss.requires_grad or not self._policy_loss_streamed:  # streamed: its chunks went backward
                    self.accelerator.backward(loss)
                total += loss.detach().to(total.device)  # agent i's loss is on its device
            for name, loss in self.shared_losses(rollout).items():  # e.g. a centralized critic: once per step
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"{name} produced a non-finite loss ({loss.item()}) at step {self.state.global_step}")
                loss = loss / self.current_gradient_accumulation_steps
                self.accelerator.backward(loss)
                total += loss.detach().to(total.device)
        finally:
            self._chunk_backward = self._step_weights = None
        if self.accelerator.sync_gradients:  # N processes: average every gradient once per optimizer step
            self.all_reduce_gradients()
        return total

    def loss_weights(self, inputs: Any) -> dict[str, float]:
        """Each loss's weight on this process (rows or tokens), keyed as the losses pass it to `_scale_for_ranks`:
        with N processes they are summed in one all-reduce per micro-step."""
        return {f"policy_{i}": self._policy_weight(i, inputs.turns) for i in range(self.num_agents)}

    def shared_losses(self, inputs: Any) -> dict[str, torch.Tensor]:
        """Losses that belong to no single agent, by name (a centralized critic's); none by default."""
        return {}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The summed loss of all agents on prepared `inputs` (training uses one backward per agent instead)."""
        loss = sum(self.agent_loss(i, inputs) for i in range(self.num_agents))
        return (loss, None) if return_outputs else loss

    # ---- logging ----
    def record_metric(self, name: str, value: float) -> None:
        self._metrics[name].append(float(value))

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:  # a training log: add what was gathered since the previous one
            logs.update(self._average_metrics(self._metrics))  # over every process when there are several
            self._metrics.clear()
            if self._agent_grad_norms:
                logs.update({f"{name}/grad_norm": value for name, value in self._agent_grad_norms.items()})
            if self.optimizer is not None:
                for group in self.optimizer.param_groups:
                    if "/" not in group.get("name", "/"):
                        logs[f"{group['name']}/learning_rate"] = group["lr"]
        logs["env_step"] = self.env_step
        super().log(logs, start_time)

    # ---- saving ----
    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        """`output_dir/agent_i/` per agent (loadable with `from_pretrained`, tokenizer included)."""
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return
        os.makedirs(output_dir, exist_ok=True)
        self._container.save_pretrained(output_dir, agent_state_dicts=self._agent_state_dicts())
        with open(os.path.join(output_dir, "training_args.json"), "w", encoding="utf-8") as f:
            f.write(self.args.to_json_string())

