"""Data-parallel training (`accelerate launch` / `torchrun`, one process per device) for `MultiAgentTrainer`.

Design (docs/scaling.md):

- The container is **not** wrapped in `DistributedDataParallel`. Each agent runs its own forward+backward
  (and critics are called directly), which breaks DDP's one-backward-per-forward reducer (and DDP would
  all-reduce every agent's buckets at every agent's backward). Instead every process averages the gradients
  of every optimizer parameter itself, once per optimizer step, right after the last micro-batch's backward
  and before clipping: `all_reduce_gradients`.
- Each process rolls out whole prompts (a prompt's group never straddles processes), so group baselines are
  local. A process's loss is weighted by its share of the global rows (tokens for `dapo`): the mean over
  processes then equals the one-process loss over the global batch.
- `env_step` is summed over processes; logged metrics are averaged over processes; checkpoints are written
  by process 0 with every process's RNG state (`rng_state_{rank}.pth`).
"""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.distributed as dist


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

    def _scale_for_ranks(self, loss: torch.Tensor, weight: float) -> torch.Tensor:
        """`loss` is this process's mean over `weight` rows (or tokens). Scale it so that the mean over processes
        of the scaled losses is the mean over all processes' rows: loss * W * weight / sum(weights)."""
        if not self._distributed:
            return loss
        total = torch.tensor([float(weight)], dtype=torch.float64, device=self._reduce_device())
        dist.all_reduce(total)
        share = world_size() * float(weight) / float(total.item())
        return loss if share == 1.0 else loss * share

    def _sum_across_ranks(self, value: int) -> int:
        if not self._distributed:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self._reduce_device())
        dist.all_reduce(t)
        return int(t.item())

    @torch.no_grad()
    def all_reduce_gradients(self) -> None:
        """Average every optimizer parameter's gradient over processes, one flat all-reduce per parameter group.
        A gradient missing on every process stays None (AdamW then skips it, as in one process)."""
        if not self._distributed or self.optimizer is None:
            return
        W = world_size()
        for group in self.optimizer.param_groups:
            params = [p for p in group["params"] if p.requires_grad]
            if not params:
                continue
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            present = torch.tensor([p.grad is not None for p in params], dtype=grads[0].dtype, device=grads[0].device)
            flat = torch.cat([g.reshape(-1) for g in grads] + [present])
            dist.all_reduce(flat)
            flat.div_(W)
            offset = 0
            for p, g in zip(params, grads):
                n = g.numel()
                chunk = flat[offset : offset + n].view_as(g)
                offset += n
                if p.grad is None:
                    p.grad = chunk.clone()
                else:
                    p.grad.copy_(chunk)
            for p, was in zip(params, flat[offset:].tolist()):
                if was == 0.0:
                    p.grad = None

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
