"""Data-parallel training (`accelerate launch` / `torchrun`, one process per device) for `MultiAgentTrainer`.

Design (docs/scaling.md):

- The container is **not** wrapped in `DistributedDataParallel`. Each agent runs its own forward+backward
  (and critics are called directly), which breaks DDP's one-backward-per-forward reducer (and DDP would
  all-reduce every agent's buckets at every agent's backward). Instead every process averages the gradients
  of every optimizer parameter (agents, critics, value heads) itself, once per optimizer step, right after the
  last micro-batch's backward and before clipping, in ~25 MB buckets: `all_reduce_gradients`. Every parameter
  and buffer starts as process 0's (`_broadcast_parameters`, as DDP does).
- Each process rolls out whole prompts (a prompt's group never straddles processes), so group baselines are
  local. A process's loss (policy or value) is weighted by its share of the global rows (tokens for `dapo`):
  the mean over processes then equals the one-process loss over the global batch. The weights and the
  env-step count are summed in one all-reduce per micro-step (`_reduce_step_counts`).
- `env_step` is summed over processes; logged metrics are averaged over processes; checkpoints are written
  by process 0 with every process's RNG state (`rng_state_{rank}.pth`) and user-object state
  (`user_state_{rank}.pt`).
"""

from __future__ import annotations

import logging
import random

import numpy as np
import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)
_BUCKET_BYTES = 25 * 2**20  # per all-reduce / broadcast, as DDP's default bucket


def _buckets(params, key=lambda p: p.grad):
    """Consecutive runs of tensors of one dtype and device, each run at most `_BUCKET_BYTES` (a single larger
    tensor is its own bucket)."""
    bucket, size, kind = [], 0, None
    for p in params:
        t = key(p)
        nbytes = t.numel() * t.element_size()
        if bucket and ((t.dtype, t.device) != kind or size + nbytes > _BUCKET_BYTES):
            yield bucket
            bucket, size = [], 0
        bucket.append(p)
        size += nbytes
        kind = (t.dtype, t.device)
    if bucket:
        yield bucket


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class DataParallelMixin:
    """Mixed into `MultiAgentTrainer`. Every method is a no-op (returns its input unchanged) in one process."""

    @property
    def _distributed(self) -> bool:
        return self.args.world_size > 1 and world_size() > 1

    def _wrap_model(self, model, training: bool = True, dataloader=None):
        """Keep the container out of DDP (see the module docstring): prepare it like an evaluation model
        (device placement, mixed precision) and mark it prepared, so `accelerator.prepare` leaves it as is."""
        if self._distributed and not (self.is_deepspeed_enabled or self.is_fsdp_enabled):
            if not getattr(model, "_is_accelerate_prepared", False):
                model = self.accelerator.prepare_model(model, evaluation_mode=True)
            return model
        return super()._wrap_model(model, training=training, dataloader=dataloader)

    def _reduce_device(self) -> torch.device:
        return self.args.device

    def _scale_for_ranks(self, loss: torch.Tensor, weight: float, key: str | None = None) -> torch.Tensor:
        """`loss` is this process's mean over `weight` rows (or tokens). Scale it so that the mean over processes
        of the scaled losses is the mean over all processes' rows: loss * W * weight / sum(weights). A `key` that
        `_reduce_step_counts` summed already costs no communication."""
        if not self._distributed:
            return loss
        local, totals = getattr(self, "_step_weights", None) or ({}, {})
        if key in totals:
            if local[key] != float(weight):  # the precomputed weight must be the one the loss uses
                raise RuntimeError(f"loss weight {key!r}: {weight} here, {local[key]} when it was reduced")
            total = totals[key]
        else:
            reduced = torch.tensor([float(weight)], dtype=torch.float64, device=self._reduce_device())
            dist.all_reduce(reduced)
            total = float(reduced.item())
        share = world_size() * float(weight) / total
        return loss if share == 1.0 else loss * share

    def _reduce_step_counts(self, env_steps: int, weights: dict[str, float]) -> int:
        """One all-reduce per micro-step for the joint actions counted and every loss's weight (instead of one
        per agent and loss): returns the global env-step count and keeps the weights' totals for
        `_scale_for_ranks` until `_step_weights` is cleared."""
        if not self._distributed:
            return env_steps
        keys = sorted(weights)
        reduced = torch.tensor([float(env_steps)] + [float(weights[k]) for k in keys], dtype=torch.float64,
                               device=self._reduce_device())
        dist.all_reduce(reduced)  # float64 holds these integer counts exactly
        values = reduced.tolist()
        self._step_weights = ({k: float(weights[k]) for k in keys}, dict(zip(keys, values[1:])))
        return int(values[0])

    @torch.no_grad()
    def all_reduce_gradients(self) -> None:
        """Average every optimizer parameter's gradient over processes, in flat buckets of at most
        `_BUCKET_BYTES` per dtype (a whole-group concatenation would double the gradients' memory). Each element
        is reduced once whatever the bucketing, so the result does not depend on it. A gradient missing on every
        process stays None (AdamW then skips it, as in one process)."""
        if not self._distributed or self.optimizer is None:
            return
        W = world_size()
        params = [p for group in self.optimizer.param_groups for p in group["params"] if p.requires_grad]
        if not params:
            return
        present = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=self._reduce_device())
        dist.all_reduce(present)  # one small reduce: which gradients exist on some process
        for p, count in zip(params, present.tolist()):
            if count and p.grad is None:  # another process has it: join with zeros, as one process would sum
                p.grad = torch.zeros_like(p)
        for bucket in _buckets([p for p in params if p.grad is not None]):
            flat = torch.cat([p.grad.reshape(-1) for p in bucket])
            dist.all_reduce(flat)
            flat.div_(W)
            offset = 0
            for p in bucket:
                n = p.grad.numel()
                p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
                offset += n

    @torch.no_grad()
    def _broadcast_parameters(self, modules) -> None:
        """Every parameter and buffer of `modules` takes process 0's value (as DDP does at wrap time): agents
        built or initialised differently on different processes would otherwise train apart, silently."""
        if not self._distributed:
            return
        tensors, seen = [], set()
        for module in modules:
            for t in list(module.parameters()) + list(module.buffers()):
                if id(t) not in seen:  # shared modules (a LoRA base under several adapters) once
                    seen.add(id(t))
                    tensors.append(t)
        differed = False
        for bucket in _buckets(tensors, key=lambda t: t.data):
            flat = torch.cat([t.data.reshape(-1) for t in bucket])
            local = flat.clone() if dist.get_rank() != 0 else None
            dist.broadcast(flat, src=0)
            differed |= local is not None and not torch.equal(local, flat)
            offset = 0
            for t in bucket:
                n = t.numel()
                t.data.copy_(flat[offset : offset + n].view_as(t))
                offset += n
        if differed:
            logger.warning("process %d held weights that differ from process 0's; they were replaced by process 0's",
                           dist.get_rank())

    def _average_metrics(self, metrics: dict[str, list[float]]) -> dict[str, float]:
        """Mean of each metric over every value recorded on every process since the last log."""
        local = {name: (sum(v), len(v)) for name, v in metrics.items() if v}
        if not self._distributed:
            return {name: s / n for name, (s, n) in local.items()}
        gathered: list = [None] * world_size()
        dist.all_gather_object(gathered, local)
        totals: dict[str, list[float]] = {}
        for part in gathered:
            for name, (s, n) in part.items():
                acc = totals.setdefault(name, [0.0, 0])
                acc[0] += s
                acc[1] += n
        return {name: s / n for name, (s, n) in sorted(totals.items())}

    def _gather_objects(self, obj) -> list:
        """[obj of process 0, obj of process 1, ...] on every process ([obj] in one process)."""
        if not self._distributed:
            return [obj]
        gathered: list = [None] * world_size()
        dist.all_gather_object(gathered, obj)
        return gathered

    def _broadcast_object(self, obj):
        if not self._distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    @staticmethod
    def _local_rng_state() -> dict:
        """This process's RNG state, in the layout of Trainer's `rng_state_{rank}.pth`."""
        state = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.random.get_rng_state_all()
        return state
