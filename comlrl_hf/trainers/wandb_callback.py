"""W&B logging against `env_step`, with a run identity that survives checkpoints and resumes."""

from __future__ import annotations

import os
import random

import numpy as np
import torch
from transformers.integrations import WandbCallback
from transformers.integrations.integration_utils import rewrite_logs

WANDB_CONFIG_KEYS = {
    "project", "entity", "name", "run_name", "id", "resume", "tags", "dir", "group", "notes", "job_type", "mode", "config",
}
_SUMMARY_ONLY = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "total_flos"}
_RUNS_OPENED_HERE: set[str] = set()


def validate_wandb_config(wandb_config: dict | None) -> dict | None:
    if wandb_config is None:
        return None
    if not isinstance(wandb_config, dict):
        raise ValueError(f"wandb_config must be a dict, got {type(wandb_config).__name__}")
    unknown = set(wandb_config) - WANDB_CONFIG_KEYS
    if unknown:
        raise ValueError(f"wandb_config has unknown keys {sorted(unknown)}; allowed: {sorted(WANDB_CONFIG_KEYS)}")
    if "name" in wandb_config and "run_name" in wandb_config and wandb_config["name"] != wandb_config["run_name"]:
        raise ValueError(f"wandb_config name={wandb_config['name']!r} and run_name={wandb_config['run_name']!r} disagree")
    return dict(wandb_config)


class MultiAgentWandbCallback(WandbCallback):
    """Opens the run lazily (at the first train or log, never at construction) from `wandb_config`, uses
    `env_step` as the x-axis and W&B step, and records the run identity on the trainer for checkpoints.

    Logging with `step=env_step` means that after a resume from an older checkpoint, W&B ignores the
    re-done steps below the last one it holds: the curve has no duplicates and never goes backwards.
    """

    def __init__(self, trainer, wandb_config: dict | None = None):
        super().__init__()
        self.trainer = trainer
        self.wandb_config = dict(wandb_config or {})

    def setup(self, args, state, model, **kwargs):
        if self._wandb is None:
            return
        if state.is_world_process_zero:
            self._open_run()
        super().setup(args, state, model, **kwargs)
        if state.is_world_process_zero:
            self._wandb.define_metric("env_step")
            self._wandb.define_metric("*", step_metric="env_step", step_sync=True)
            run = self._wandb.run
            self.trainer.wandb_identity = {"id": run.id, "project": run.project, "entity": run.entity or None}

    def _open_run(self) -> None:
        config = dict(self.wandb_config)
        wanted = config.get("id")
        run = self._wandb.run
        if run is not None:
            if wanted is None or run.id == wanted:
                return  # continue the active run (opened by the user or by an earlier trainer)
            if run.id not in _RUNS_OPENED_HERE:
                raise ValueError(f"W&B run {run.id!r} is active but wandb_config asks for id {wanted!r}; finish it first")
            run.finish()
        kwargs = {k: v for k, v in config.items() if k != "run_name"}
        kwargs.setdefault("name", config.get("run_name"))
        kwargs.setdefault("project", os.getenv("WANDB_PROJECT", "comlrl_hf"))
        # Opening a run must not move the training random streams (resume must stay bitwise).
        states = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
        try:
            run = self._wandb.init(**{k: v for k, v in kwargs.items() if v is not None})
        finally:
            random.setstate(states[0])
            np.random.set_state(states[1])
            torch.random.set_rng_state(states[2])
        _RUNS_OPENED_HERE.add(run.id)

    def on_log(self, args, state, control, model=None, logs=None, **kwargs):
        if self._wandb is None:
            return
        if not self._initialized:
            self.setup(args, state, model)
        if not state.is_world_process_zero:
            return
        logs = dict(logs or {})
        env_step = int(logs.pop("env_step", self.trainer.env_step))
        for key in _SUMMARY_ONLY & logs.keys():
            self._wandb.run.summary[key] = logs.pop(key)
        self._wandb.log(
            {**rewrite_logs(logs), "train/global_step": state.global_step, "env_step": env_step}, step=env_step
        )
