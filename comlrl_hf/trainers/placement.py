"""Model placement on one machine: `agent_devices` (and `critic_devices`) put each agent (and critic) on a
device of its own, in one process.

Without them every model sits on the trainer's device (`args.device`), where the Trainer moves the container.
With them:

- each agent (with its value head, reference copy and rollout tensors) lives on its device: generation builds
  agent i's token ids where agent i's weights are, and its loss and backward run there;
- rewards, values, returns and advantages are computed on one common device, the trainer's (`args.device`),
  and an agent's advantages are moved to its device for its loss; a critic's targets go to the critic's device;
- the container is never moved wholesale: `place_model_on_device` is False, `is_model_parallel` is True (so
  the Trainer neither calls `_move_model_to_device` nor wraps the container in `nn.DataParallel` when several
  GPUs are visible), and accelerate prepares the container with `device_placement=False`;
- gradients are clipped per agent on that agent's device (`MultiAgentTrainer._clip_grad_norm`), and the
  checkpoint keeps the RNG state of every CUDA device (Trainer keeps only the current one in one process), so
  agents sampling on several GPUs resume exactly.

Placement is per process: with several processes (`accelerate launch`, `torchrun`) it is refused, since every
process would need its own devices. Shared-base LoRA (`peft_backend="shared"`) keeps N adapters on one base,
which cannot sit on two devices: only one device for all agents is accepted with it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import torch

logger = logging.getLogger(__name__)

CUDA_RNG_ALL_NAME = "rng_state_cuda_all.pth"


def parse_device(field: str, value) -> torch.device:
    """One placement entry as a torch device: "cpu" or "cuda"/"cuda:i" (an existing CUDA device); anything
    else raises naming `value`. "cuda" means the current CUDA device, written out with its index."""
    if not isinstance(value, str):
        raise ValueError(f"{field} entries must be device strings such as 'cuda:0' or 'cpu', got {value!r}")
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError, ValueError) as error:
        raise ValueError(f"{field}: {value!r} is not a torch device ({error})") from error
    if device.type == "cpu":
        return torch.device("cpu")  # parameters report "cpu", never "cpu:0"
    if device.type != "cuda":
        raise ValueError(f"{field}: {value!r} is not supported for placement (use 'cpu' or 'cuda:<index>')")
    if not torch.cuda.is_available():
        raise ValueError(f"{field}: {value!r} needs CUDA, which is not available on this machine")
    count = torch.cuda.device_count()
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= count:
        raise ValueError(f"{field}: {value!r} does not exist: {count} CUDA device(s) are visible (cuda:0..cuda:{count - 1})")
    return torch.device("cuda", index)


def normalize_devices(field: str, value) -> list[str] | None:
    """The config form: None, or a non-empty list of device strings (one string stands for a one-element list,
    meaning every model on that device). Each entry is checked with `parse_device`."""
    if value is None:
        return None
    entries = [value] if isinstance(value, str) else value
    if not isinstance(entries, Sequence) or isinstance(entries, bytes) or len(entries) == 0:
        raise ValueError(f"{field} must be a device string or a non-empty list of them, got {value!r}")
    entries = list(entries)
    for entry in entries:
        parse_device(field, entry)
    return entries


def resolve_devices(field: str, value: list[str] | None, count: int, owner: str) -> list[torch.device] | None:
    """One device per model: a one-element list places all `count` models there, else one entry per model."""
    if value is None:
        return None
    if len(value) not in (1, count):
        raise ValueError(
            f"{field} has {len(value)} entries {value!r} but there are {count} {owner}; give one device for all or one per model"
        )
    devices = [parse_device(field, entry) for entry in value]
    return devices * count if len(devices) == 1 else devices


def check_placement_world_size(world_size: int, agent_devices, critic_devices) -> None:
    if world_size > 1 and (agent_devices is not None or critic_devices is not None):
        raise ValueError(
            f"agent_devices / critic_devices place models within one process, but this run has {world_size} processes "
            "(each would need its own devices); use one process, or data parallelism without them"
        )


class PlacementMixin:
    """Mixed into `MultiAgentTrainer`: per-agent and per-critic devices (see the module docstring)."""

    _agent_devices: list[torch.device] | None = None
    _critic_devices: list[torch.device] | None = None

    @property
    def placement_active(self) -> bool:
        return self._agent_devices is not None or self._critic_devices is not None

    def _resolve_agent_placement(self, args, num_agents: int) -> None:
        """Before any model is loaded: agent devices, and the Trainer's n_gpu (one process drives the devices
        itself; Trainer does the same for model-parallel models)."""
        self._agent_devices = resolve_devices("agent_devices", args.agent_devices, num_agents, "agents")
        if args.agent_devices is not None or getattr(args, "critic_devices", None) is not None:
            check_placement_world_size(args.world_size, args.agent_devices, getattr(args, "critic_devices", None))
            if getattr(self, "_fsdp", False):  # FSDP shards every agent over the processes' devices
                raise ValueError(
                    f"agent_devices={args.agent_devices} / critic_devices={getattr(args, 'critic_devices', None)} cannot "
                    "be combined with FSDP, which places each agent's shards on the processes' own devices"
                )
            args._n_gpu = 1

    def _check_shared_base_placement(self, backend: str | None) -> None:
        if backend == "shared" and self._agent_devices is not None and len(set(self._agent_devices)) > 1:
            raise ValueError(
                f"agent_devices {[str(d) for d in self._agent_devices]} puts agents on different devices, but "
                "peft_backend='shared' keeps every agent's adapter on one base model, which cannot sit on two devices; "
                "pass peft_backend='separate' (one PeftModel per agent) or one device for all agents"
            )

    def agent_device(self, index: int) -> torch.device:
        """Where agent `index` (its weights, rollout tensors and loss) lives."""
        return self._agent_devices[index] if self._agent_devices is not None else self.args.device

    def critic_device(self, index: int) -> torch.device:
        """Where separate critic `index` lives (resolved by the actor-critic trainers before loading)."""
        return self._critic_devices[index] if self._critic_devices is not None else self.args.device

    def _place(self, models: Sequence[torch.nn.Module], device_of) -> None:
        if not self.placement_active:
            return
        for i, model in enumerate(models):
            model.to(device_of(i))

    def _wrap_model(self, model, training: bool = True, dataloader=None):
        """With placement, accelerate prepares the container (mixed precision, its bookkeeping) without moving
        it to one device; marked prepared, the Trainer's later `accelerator.prepare(model, optimizer)` leaves it."""
        if self.placement_active:
            if not getattr(model, "_is_accelerate_prepared", False):
                model = self.accelerator.prepare_model(model, device_placement=False)
            return model
        return super()._wrap_model(model, training=training, dataloader=dataloader)

    # ---- RNG of every CUDA device ----
    def _save_rng_state(self, output_dir: str) -> None:
        """Trainer's RNG file, plus, in one process with CUDA, every CUDA device's RNG state (Trainer saves only
        the current device's there; agents sampling on other GPUs would resume on other streams)."""
        super()._save_rng_state(output_dir)
        if torch.cuda.is_available() and not getattr(self, "_distributed", False):
            torch.save(torch.cuda.random.get_rng_state_all(), os.path.join(output_dir, CUDA_RNG_ALL_NAME))

    def _load_rng_state(self, checkpoint: str | None) -> None:
        super()._load_rng_state(checkpoint)
        path = os.path.join(checkpoint, CUDA_RNG_ALL_NAME) if checkpoint is not None else None
        if path is None or not os.path.isfile(path) or not torch.cuda.is_available():
            return
        states = torch.load(path, map_location="cpu", weights_only=True)
        count = torch.cuda.device_count()
        if len(states) != count:
            logger.warning(
                "%s holds the RNG of %d CUDA device(s) but %d are visible now; restoring the first %d (sampling on the "
                "others will differ from the uninterrupted run)", path, len(states), count, min(count, len(states)),
            )
        for index, state in enumerate(states[:count]):
            torch.cuda.random.set_rng_state(state, device=index)
