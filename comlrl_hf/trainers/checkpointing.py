"""Epoch checkpoints, exact resume and compatibility checks for `MultiAgentTrainer`.

Trainer already saves and restores the optimizer, scheduler, RNG and `trainer_state.json`, and skips the
batches a mid-epoch checkpoint had trained. This mixin adds what N agents need: epoch-named folders
(`checkpoint-K` = K completed epochs; `checkpoint-step-N` for `save_strategy="steps"`), atomic publication,
`comlrl_state.json` (env_step, run id, W&B identity, buffered metrics, fingerprints, a sha256 manifest),
in-place loading of every `agent_i/`, stateful user objects, and a refusal, before any state changes, to
resume a checkpoint that does not belong to this trainer.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import math
import os
import shutil
import uuid
from typing import Any

import torch
from transformers import TrainerCallback, TrainingArguments
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import SaveStrategy

from ..utils.checkpoint import (
    FORMAT_VERSION,
    STATE_NAME,
    CheckpointError,
    checkpoint_name,
    file_manifest,
    latest_checkpoint,
    list_checkpoints,
    publish,
    read_checkpoint_metadata,
    remove_stale_staging,
    retire,
    seal_metadata,
    staging_dir,
    verify_manifest,
    write_failure_message,
    write_json,
)

USER_STATE_NAME = "user_state.pt"
# TrainingArguments fields that change the math and so must match on resume (multi-agent fields are
# compared too, all but `RESUMABLE_CHANGES`).
MATCHED_TRAINING_ARGS = (
    "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate", "weight_decay", "adam_beta1",
    "adam_beta2", "adam_epsilon", "max_grad_norm", "lr_scheduler_type", "warmup_steps", "optim", "seed", "bf16", "fp16",
)
# What the spec lets change between the run and its resume: length, devices, logging and evaluation. (Placement
# changes nothing on CPU; across device types a resume continues correctly but not bitwise: docs/scaling.md.)
RESUMABLE_CHANGES = {
    "num_train_epochs", "num_iterations", "eval_do_sample", "log_completions", "num_completions_to_print", "agent_devices",
    "critic_devices", "reward_model_device",
}


class EpochCheckpointCallback(TrainerCallback):
    """Asks for a checkpoint at every `interval`-th completed epoch and at the last one (a run stopped
    mid-epoch, e.g. by `max_steps`, gets a step checkpoint instead)."""

    def __init__(self, trainer, interval: int):
        self.trainer, self.interval = trainer, interval

    def on_epoch_end(self, args, state, control, **kwargs):
        completed = round(state.epoch)
        whole = abs(state.epoch - completed) < 1e-6
        if whole and (completed % self.interval == 0 or completed >= math.ceil(args.num_train_epochs)):
            control.should_save = True
            self.trainer._pending_epoch_checkpoint = True
        elif control.should_training_stop:
            control.should_save = True


class _RestoreLogAccumulators(TrainerCallback):
    """Trainer restarts its loss accumulator on resume; put back what the checkpoint had not logged yet, so
    the first log after a mid-interval resume equals the uninterrupted run's."""

    def __init__(self, trainer, pending_loss: float, last_logged_step: int):
        self.trainer, self.pending_loss, self.last_logged_step = trainer, pending_loss, last_logged_step

    def on_train_begin(self, args, state, control, **kwargs):
        self.trainer._tr_loss += self.pending_loss
        self.trainer._globalstep_last_logged = self.last_logged_step
        self.trainer.remove_callback(self)


def _sha(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def model_fingerprint(model: torch.nn.Module) -> str:
    return _sha([type(model).__name__, [(n, list(p.shape), str(p.dtype)) for n, p in model.named_parameters()]])


def tokenizer_fingerprint(tokenizer) -> str:
    return _sha([sorted(tokenizer.get_vocab().items()), tokenizer.special_tokens_map, tokenizer.chat_template])


def dataset_fingerprint(dataset) -> dict | None:
    """Length plus a content hash of up to 1,000 evenly spaced rows (values that are not JSON count by type,
    so objects whose text holds a memory address do not change the hash between runs)."""
    if dataset is None:
        return None
    n = len(dataset)
    rows = range(0, n, max(1, n // 1000))
    payload = json.dumps([dataset[i] for i in rows], sort_keys=True, default=lambda o: type(o).__name__)
    return {"length": n, "sha256": hashlib.sha256(payload.encode()).hexdigest()}


@contextlib.contextmanager
def _objects_alive_now_frozen():
    """`gc.freeze()` for the duration of training, after one full collection: the ~400k objects of
    torch/transformers/datasets are then skipped by every later full collection (a full pass costs 0.27 s on the
    2-core CPU; accelerate runs one right at `train()` start and Python runs more as training allocates). Garbage is
    collected first, so a previous trainer's cycles are freed, not kept for the run. A caller that froze objects
    itself keeps its own choice."""
    if gc.get_freeze_count():
        yield
        return
    gc.collect()  # garbage that exists now (a previous trainer in a notebook or sweep) must not be frozen with the rest
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class CheckpointMixin:
    """Mixed into `MultiAgentTrainer` (see the module docstring)."""

    _checkpoint_dir: str | None = None
    _checkpoint_total_limit: int | None = None
    _pending_epoch_checkpoint = False

    # ---- train() with the spec's checkpoint arguments ----
    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial=None,
        ignore_keys_for_eval=None,
        *,
        checkpoint_dir: str | os.PathLike | None = None,
        checkpoint_interval: int | None = None,
        checkpoint_total_limit: int | None = None,
    ):
        """`transformers.Trainer.train`, plus epoch checkpoints: `checkpoint_dir` (default `args.output_dir`),
        `checkpoint_interval` (epochs, default 1 when `checkpoint_dir` is given) and `checkpoint_total_limit`
        (newest kept). `resume_from_checkpoint=True` takes the latest complete checkpoint of that folder."""
        for name, value in (("checkpoint_interval", checkpoint_interval), ("checkpoint_total_limit", checkpoint_total_limit)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self._checkpoint_dir = os.fspath(checkpoint_dir) if checkpoint_dir is not None else self.args.output_dir
        self._checkpoint_total_limit = checkpoint_total_limit or self.args.save_total_limit
        if self.args.should_save:
            remove_stale_staging(self._checkpoint_dir)  # before looking for the latest checkpoint
        if self._distributed:
            self.accelerator.wait_for_everyone()
        for callback in [c for c in self.callback_handler.callbacks if isinstance(c, (EpochCheckpointCallback, _RestoreLogAccumulators))]:
            self.remove_callback(callback)
        if checkpoint_dir is not None or checkpoint_interval is not None:
            self.add_callback(EpochCheckpointCallback(self, checkpoint_interval or 1))
        reuse = self.rollout_reuse_count()
        if reuse > 1 and self.args.max_steps > 0 and self.args.max_steps % reuse:
            raise ValueError(f"max_steps={self.args.max_steps} must be a multiple of num_ppo_epochs={reuse}")
        if reuse > 1 and self.args.save_strategy == SaveStrategy.STEPS and self.args.save_steps % reuse:
            raise ValueError(
                f"save_steps={self.args.save_steps} must be a multiple of num_ppo_epochs={reuse}, so that "
                "checkpoints never fall inside a reused rollout"
            )
        if resume_from_checkpoint is True:
            resume_from_checkpoint = latest_checkpoint(self._checkpoint_dir)
            if resume_from_checkpoint is None:
                raise CheckpointError(f"resume_from_checkpoint=True but {self._checkpoint_dir} holds no complete checkpoint")
        elif resume_from_checkpoint is False:
            resume_from_checkpoint = None
        if resume_from_checkpoint is not None:
            resume_from_checkpoint = os.fspath(resume_from_checkpoint)
            metadata = self._check_resumable(resume_from_checkpoint)
            self._restore_runtime(metadata)
        else:
            self._run_id = self._broadcast_object(getattr(self, "_run_id", None) or uuid.uuid4().hex)  # process 0's
            foreign = [p for p in list_checkpoints(self._checkpoint_dir)
                       if read_checkpoint_metadata(p).get("run_id") != self._run_id]
            if foreign and (checkpoint_dir is not None or checkpoint_interval is not None
                            or self.args.save_strategy != SaveStrategy.NO):
                raise CheckpointError(
                    f"{self._checkpoint_dir} already holds checkpoints of another run ({os.path.basename(foreign[-1])}, ...); "
                    "resume it with resume_from_checkpoint=True, or write to an empty folder"
                )
        with _objects_alive_now_frozen():
            return super().train(
                resume_from_checkpoint=resume_from_checkpoint, trial=trial, ignore_keys_for_eval=ignore_keys_for_eval
            )

    # ---- what must match ----
    def stateful_objects(self) -> dict[str, Any]:
        """User objects whose `state_dict()` / `load_state_dict()` are saved with checkpoints."""
        candidates = {"train_dataset": self.train_dataset}
        for name, obj in getattr(self, "_user_callables", {}).items():  # reward_func, formatters, ...
            if isinstance(obj, (list, tuple)):
                candidates.update({f"{name}.{i}": item for i, item in enumerate(obj)})
            else:
                candidates[name] = obj
        seen: dict[str, int] = {}
        for callback in self.callback_handler.callbacks:  # named by class, not position: positions shift
            name = type(callback).__name__
            seen[name] = seen.get(name, 0) + 1
            candidates[f"callbacks.{name}" + (f".{seen[name]}" if seen[name] > 1 else "")] = callback
        return {name: obj for name, obj in candidates.items() if _is_stateful(obj)}

    def compatibility_fingerprint(self) -> dict[str, Any]:
        args = json.loads(self.args.to_json_string())
        own = [f for f in type(self.args).__dataclass_fields__ if f not in TrainingArguments.__dataclass_fields__]
        keys = sorted((set(own) | set(MATCHED_TRAINING_ARGS) | {"shuffle_dataset"}) - RESUMABLE_CHANGES)
        return {
            "num_agents": self.num_agents,
            "agents": [model_fingerprint(a) for a in self.agents],
            "critics": [model_fingerprint(c) for c in (self._container.critics or [])],
            "tokenizers": [tokenizer_fingerprint(t) for t in self.tokenizers],
            "dataset": dataset_fingerprint(self.train_dataset),
            "config": {k: args.get(k) for k in keys},
            "stateful": sorted(self.stateful_objects()),
            "peft": self.peft_fingerprint(),
        }

    def _check_resumable(self, path: str) -> dict[str, Any]:
        """Everything is checked before anything is restored; the error names what differs."""
        if not os.path.isdir(path):
            raise CheckpointError(f"checkpoint {path} does not exist")
        metadata = read_checkpoint_metadata(path)
        if not metadata.get("manifest"):
            raise CheckpointError(f"checkpoint {path} has no file manifest; it cannot be verified")
        verify_manifest(path, metadata["manifest"])
        expected = f"{type(self).__module__}.{type(self).__qualname__}"
        if metadata.get("trainer_class") != expected:
            raise CheckpointError(f"checkpoint {path} was written by {metadata.get('trainer_class')}, not {expected}")
        processes = self.args.world_size if self._distributed else 1
        if metadata.get("world_size", 1) != processes:  # each process's RNG and buffers are in the checkpoint
            raise CheckpointError(
                f"checkpoint {path} was written by {metadata.get('world_size', 1)} process(es), this run has "
                f"{processes}; resume with the same number of processes"
            )
        saved, current = metadata.get("fingerprint", {}), self.compatibility_fingerprint()
        differences = []
        for key in ("num_agents", "agents", "critics", "tokenizers", "dataset", "stateful", "peft"):
            if saved.get(key) != current[key]:
                differences.append(f"{key}: checkpoint {_short(saved.get(key))}, now {_short(current[key])}")
        for key in sorted(set(saved.get("config", {})) | set(current["config"])):
            old, new = saved.get("config", {}).get(key), current["config"].get(key)
            if old != new:
                differences.append(f"config {key}: checkpoint {old!r}, now {new!r}")
        if differences:
            raise CheckpointError(f"cannot resume from {path}; it differs from this trainer in " + "; ".join(differences))
        self._read_user_states(path)  # loaded now, so a bad file fails before any state changes
        return metadata

    def _read_user_states(self, path: str) -> dict:
        file = os.path.join(path, _user_state_name(self.args.process_index) if self._distributed else USER_STATE_NAME)
        if not os.path.isfile(file):
            return {}
        try:
            return torch.load(file, map_location="cpu", weights_only=True)
        except Exception as error:
            raise CheckpointError(f"{file} cannot be loaded safely (weights_only=True): {error}") from error

    def _restore_runtime(self, metadata: dict[str, Any]) -> None:
        self.env_step = int(metadata["env_step"])
        self._micro_step = int(metadata.get("micro_step", 0))
        self._run_id = metadata.get("run_id") or uuid.uuid4().hex
        self.wandb_identity = metadata.get("wandb") or getattr(self, "wandb_identity", None)
        self._metrics.clear()
        metrics, pending_loss = metadata.get("metrics") or {}, metadata.get("pending_loss", 0.0)
        if self._distributed and metadata.get("rank_metrics"):  # each process gets back its own buffers
            rank = self.args.process_index
            if len(metadata["rank_metrics"]) != self.args.world_size:
                raise CheckpointError(
                    f"the checkpoint was written by {len(metadata['rank_metrics'])} processes, this run has "
                    f"{self.args.world_size}; resume with the same number of processes"
                )
            metrics, pending_loss = metadata["rank_metrics"][rank], metadata["rank_pending_loss"][rank]
        for name, values in metrics.items():
            self._metrics[name] = list(values)
        self.add_callback(_RestoreLogAccumulators(
            self, pending_loss, metadata.get("last_logged_step", metadata["global_step"])))

    # ---- saving ----
    def _save_checkpoint(self, model, trial) -> None:
        kind = "epoch" if self._pending_epoch_checkpoint else "step"
        self._pending_epoch_checkpoint = False
        count = self._checkpoint_count(kind)
        if self.hp_search_backend is None and trial is None:
            self.store_flos()
        pending_loss = self._tr_loss.item() if hasattr(self, "_tr_loss") else 0.0
        if self._distributed:  # every process's RNG and unlogged buffers, written by process 0
            per_rank = self._gather_objects({
                "rng": self._local_rng_state(), "metrics": {k: list(v) for k, v in self._metrics.items()},
                "pending_loss": pending_loss,
                # a stateful reward function or dataset sees this process's shard: its state is per process
                "user": {name: obj.state_dict() for name, obj in self.stateful_objects().items()},
            })
            try:
                if self.args.should_save:
                    self._write_checkpoint(kind, count, pending_loss, per_rank)
            finally:
                self.accelerator.wait_for_everyone()
            return
        if not self.args.should_save:
            return
        self._write_checkpoint(kind, count, pending_loss, None)

    def _write_checkpoint(self, kind: str, count: int, pending_loss: float, per_rank: list | None) -> None:
        parent = self._checkpoint_dir or self.args.output_dir
        name = checkpoint_name(kind, count)
        staging = None
        try:  # a failed write (a full disk, ...) leaves no staging folder and names the checkpoint
            staging = staging_dir(parent, name)
            self.save_model(staging, _internal_call=True)
            if not self.args.save_only_model:
                self._save_optimizer_and_scheduler(staging)
                self._save_scaler(staging)
                if per_rank is None:
                    self._save_rng_state(staging)
                else:  # Trainer's file names: `_load_rng_state` reads rng_state_{process_index}.pth
                    for rank, part in enumerate(per_rank):
                        torch.save(part["rng"], os.path.join(staging, f"rng_state_{rank}.pth"))
            for callback in self.callback_handler.callbacks + [self.control]:
                if isinstance(callback, ExportableState):
                    state = callback.state()
                    slot = self.state.stateful_callbacks.get(type(callback).__name__)
                    if isinstance(slot, list):
                        slot.append(state)
                    else:
                        self.state.stateful_callbacks[type(callback).__name__] = state
            self.state.save_to_json(os.path.join(staging, "trainer_state.json"))
            if per_rank is None:
                files = {USER_STATE_NAME: {name: obj.state_dict() for name, obj in self.stateful_objects().items()}}
            else:
                files = {_user_state_name(rank): part["user"] for rank, part in enumerate(per_rank)}
            for file, user_states in files.items():
                if not user_states:
                    continue
                path = os.path.join(staging, file)
                torch.save(user_states, path)
                try:  # resume loads it with weights_only=True: refuse now what could not be loaded then
                    torch.load(path, map_location="cpu", weights_only=True)
                except Exception as error:
                    shutil.rmtree(staging, ignore_errors=True)
                    raise CheckpointError(
                        f"the state_dict() of {sorted(user_states)} holds objects a weights_only load cannot restore "
                        f"(use tensors, numbers, strings, lists and dicts): {error}"
                    ) from error
            extra = self._save_extra_state(staging)
            write_json(os.path.join(staging, STATE_NAME), seal_metadata({
                "format_version": FORMAT_VERSION,
                "trainer_class": f"{type(self).__module__}.{type(self).__qualname__}",
                "kind": kind,
                "boundary": count if kind == "epoch" else int(self.state.epoch),
                "global_step": self.state.global_step,
                "epoch": self.state.epoch,
                "env_step": self.env_step,
                "micro_step": self._micro_step,
                "run_id": getattr(self, "_run_id", None),
                "wandb": getattr(self, "wandb_identity", None),
                "metrics": {k: list(v) for k, v in self._metrics.items()},
                "pending_loss": pending_loss,
                "world_size": 1 if per_rank is None else len(per_rank),
                **({} if per_rank is None else {
                    "rank_metrics": [part["metrics"] for part in per_rank],
                    "rank_pending_loss": [part["pending_loss"] for part in per_rank],
                }),
                "last_logged_step": getattr(self, "_globalstep_last_logged", self.state.global_step),
                "fingerprint": self.compatibility_fingerprint(),
                "extra": extra,
                "manifest": file_manifest(staging),
            }))
            publish(staging, os.path.join(parent, name))
        except CheckpointError:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
            raise
        except Exception as error:  # safetensors and torch.save do not raise OSError on a full disk
            message = write_failure_message(name, parent, staging, error)  # free space before the clean-up
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
            raise CheckpointError(message) from error
        if self.args.push_to_hub:  # our override uploads the agent_i/ layout (Trainer's pushes root files only)
            self._push_from_checkpoint(os.path.join(parent, name))
        limit = self._checkpoint_total_limit
        if limit:
            for old in list_checkpoints(parent)[:-limit]:
                retire(old)

    def _checkpoint_count(self, kind: str) -> int:
        """K of `checkpoint-K` (completed epochs) or N of `checkpoint-step-N`."""
        return round(self.state.epoch) if kind == "epoch" else self.state.global_step

    def _save_extra_state(self, staging: str) -> dict:
        """Trainer-specific files written into the checkpoint before its manifest; returns metadata."""
        return {}

    # ---- loading ----
    def _load_agent_weights(self, path: str) -> None:
        self._container.load_weights(path)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """Load every `agent_i/` (and critic) into the live models in place (before the optimizer exists),
        then the user objects' state."""
        try:
            self._load_agent_weights(resume_from_checkpoint)
        except (FileNotFoundError, ValueError) as error:
            raise CheckpointError(str(error)) from error
        states = self._read_user_states(resume_from_checkpoint)
        for name, obj in self.stateful_objects().items():
            if name in states:
                obj.load_state_dict(states[name])


def _user_state_name(rank: int) -> str:
    """With N processes, each process's user objects are saved in their own file (as `rng_state_{rank}.pth`)."""
    return f"user_state_{rank}.pt"


def _is_stateful(obj) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
