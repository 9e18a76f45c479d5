"""MARLHF: learn a joint Bradley-Terry reward model from preference pairs, then RL against it (spec §3).

Each iteration (one for MARLHF, `num_iterations` for MARLHFIter) runs three stages at the start of its
first RL epoch:
  1. pairs: every agent samples M completions per prompt; the M aligned joint candidates are scored with
     the task `reward_func`, and pairs (w, l) with r_w > r_l are kept (`utils.preference.select_pairs`);
  2. reward model: a fresh scalar head on the `reward_model_name` backbone is fitted to the pairs with the
     Bradley-Terry loss (`utils.preference.bradley_terry_loss`), then frozen;
  3. RL: `num_train_epochs` epochs of the `rl_algorithm` backend (MAGRPO family, IAC or MAAC) with the
     reward model in place of the task reward. Evaluation keeps the task reward.
Stages 1-2 draw their randomness from their own seeded streams, so the RL stream is the same whether a
stage ran in this process or was restored from a checkpoint; a finished stage is never recomputed.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import math
import os

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback

from ...models.reward_model import (
    joint_text, load_reward_model, own_memory, resolve_reward_model_device, reward_scores,
)
from ...utils._trl_compat import disable_dropout_in_model
from ...utils.checkpoint import list_checkpoints
from ...utils.model_sources import load_kwargs, source_name
from ...utils.preference import bradley_terry_loss, select_pairs
from ...rollout.seeded import prompt_seed
from ...utils.seeding import seeded_stream
from ..actor_critic import IACTrainer, MAACTrainer
from ..base import MultiAgentTrainer
from ..checkpointing import EpochCheckpointCallback
from ..reinforce import MAGRPOTrainer
from .config import MARLHFConfig, MARLHFIterConfig

logger = logging.getLogger(__name__)
PREFERENCE_STATE_NAME = "preference_state.json"
REWARD_MODEL_DIR = "reward_model"
_BACKENDS = {"iac": IACTrainer, "maac": MAACTrainer}  # every other rl_algorithm is the MAGRPO family
_SIGNATURE = inspect.signature(MultiAgentTrainer.__init__)


@functools.cache
def _with_backend(cls, algorithm: str):
    backend = _BACKENDS.get(algorithm, MAGRPOTrainer)
    name = f"{cls.__name__}[{algorithm}]"
    return type(name, (cls, backend), {"__module__": cls.__module__, "__qualname__": name, "_backend": backend})


class _PreferenceStages(TrainerCallback):
    def __init__(self, trainer):
        self.trainer = trainer

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.trainer._run_stages(math.floor(state.epoch + 1e-9))

    def on_epoch_end(self, args, state, control, **kwargs):
        if abs(state.epoch - round(state.epoch)) < 1e-6:  # not when `max_steps` stopped the epoch part-way
            self.trainer._boundaries += 1


class MARLHFTrainer(MultiAgentTrainer):
    """Preference-based multi-agent RL with a learned joint reward model.

    ```python
    >>> from comlrl_hf.trainers.preference import MARLHFConfig, MARLHFTrainer
    >>> trainer = MARLHFTrainer(
    ...     agent_model=model_dir, num_agents=2, reward_func=reward_func, train_dataset=train_dataset,
    ...     args=MARLHFConfig(num_agents=2, num_turns=1, reward_model_name=model_dir,
    ...                       reward_model_device=None, rl_algorithm="magrpo"))  # doctest: +SKIP
    >>> trainer.train()  # doctest: +SKIP
    ```

    Takes the constructor of [`MAGRPOTrainer`], plus `critic_model` / `critics` for `rl_algorithm="iac"|"maac"`
    (default: `critic_model_name`, else the first agent's id). The instance is a subclass of the backend's
    trainer (`isinstance(trainer, IACTrainer)` holds for iac). `trainer.reward_model` is the trained
    `AutoModelForSequenceClassification`; `save_model` writes it to `reward_model/` beside `agent_i/`.
    """

    config_class = MARLHFConfig
    algorithm_name = "MARLHF"
    supports_data_parallel = True  # tests/test_ddp.py (magrpo backend; iac/maac backends are tested alone)
    # pair collection gives processes unequal numbers of generate calls, each an all-gather under FSDP (a hang)
    supports_fully_sharded = False
    _backend = None

    def __new__(cls, *args, **kwargs):
        if cls._backend is not None:
            return super().__new__(cls)
        base_kwargs = {k: v for k, v in kwargs.items() if k not in ("critic_model", "critics", "critic_peft_config")}
        config = _SIGNATURE.bind(None, *args, **base_kwargs).arguments.get("args")
        algorithm = config.rl_algorithm if isinstance(config, MARLHFConfig) else "magrpo"
        return super().__new__(_with_backend(cls, algorithm))

    def __init__(self, *args, critic_model=None, critics=None, critic_peft_config=None, **kwargs):
        arguments = _SIGNATURE.bind(None, *args, **kwargs).arguments
        arguments.pop("self")
        config = arguments.get("args") or self.config_class(output_dir=f"{self.algorithm_name}-output")
        arguments["args"] = config
        if isinstance(config, MARLHFConfig) and config.is_actor_critic:
            if critic_model is None and critics is None and (config.rl_algorithm == "maac" or config.use_separate_critic):
                critic_model = config.critic_model_name or self._first_agent_id(arguments, "critic_model_name")
            arguments.update(critic_model=critic_model, critics=critics, critic_peft_config=critic_peft_config)
        elif critic_model is not None or critics is not None or critic_peft_config is not None:
            raise ValueError(
                f"critic_model / critics / critic_peft_config need rl_algorithm 'iac' or 'maac', got {config.rl_algorithm!r}"
            )
        if isinstance(config, MARLHFConfig):  # else the base constructor names the wrong config type
            self._reward_source = config.reward_model_name or self._first_agent_id(arguments, "reward_model_name")
            self._reward_device = resolve_reward_model_device(config.reward_model_device, config.device)
            if config.world_size > 1 and self._reward_device.type != "cpu":  # one accelerator per process
                self._reward_device = config.device
            self.reward_tokenizer = AutoTokenizer.from_pretrained(self._reward_source)  # fails early on a bad source
        super().__init__(**arguments)
        self.reward_model = None
        self._use_reward_model = False
        self._boundaries = 0  # completed stages and RL epochs: checkpoint-K's K
        self._stage = {"iteration": -1, "pairs": None, "reward_model_trained": False}
        self.preference_history: list[dict] = []
        self._artifact_dir = self.args.output_dir
        self.add_callback(_PreferenceStages(self))

    @staticmethod
    def _first_agent_id(arguments: dict, field: str) -> str:
        agents = arguments.get("agents")
        first = agents[0] if agents else arguments.get("agent_model")
        name = source_name(first) if first is not None else None
        if not name:
            raise ValueError(f"{field} is required when the agents are model objects without a name_or_path")
        return name

    # ---- iterations ----
    def iteration_of(self, epoch: int) -> int:
        """The preference iteration RL epoch `epoch` (0-based) belongs to: always 0 for MARLHF."""
        return 0

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """`MultiAgentTrainer.train`; when resuming into an output folder that already holds files, this run's
        preference artifacts go to `output_dir/resume-K` (spec §5)."""
        if resume_from_checkpoint and os.path.isdir(self.args.output_dir):
            own = {os.path.basename(p) for p in list_checkpoints(self.args.output_dir)}
            if [n for n in os.listdir(self.args.output_dir) if n not in own and not n.startswith((".", "resume-"))]:
                k = 1
                while os.path.exists(os.path.join(self.args.output_dir, f"resume-{k}")):
                    k += 1
                self._artifact_dir = os.path.join(self.args.output_dir, f"resume-{k}")
                logger.info("the output folder holds files; this resumed run writes to %s", self._artifact_dir)
        return super().train(resume_from_checkpoint, trial, ignore_keys_for_eval, **kwargs)

    def _run_stages(self, epoch: int) -> None:
        iteration = self.iteration_of(epoch)
        path, self._rng_checkpoint = getattr(self, "_rng_checkpoint", None), None
        if path is not None:
            # Trainer restores a resumed run's RNG only after on_epoch_begin; restore it first, so that stage
            # checkpoints written here carry the checkpoint's RNG, as in the uninterrupted run
            self._load_rng_state(path)
        if iteration != self._stage["iteration"]:
            self._stage = {"iteration": iteration, "pairs": None, "reward_model_trained": False}
            self.reward_model = None  # each iteration learns preferences again from the source
        if self._stage["pairs"] is None:
            self._stage["pairs"] = self.collect_pairs(iteration)
            self._write_artifact(iteration)
            self._stage_completed()
        if not self._stage["reward_model_trained"]:
            self.preference_history.append(self.fit_reward_model(iteration, self._stage["pairs"]))
            self._stage["reward_model_trained"] = True
            self._write_artifact(iteration)
            self._stage_completed()

    def _stage_completed(self) -> None:
        self._boundaries += 1
        if any(isinstance(c, EpochCheckpointCallback) for c in self.callback_handler.callbacks):
            self._pending_epoch_checkpoint = True
            self._save_checkpoint(self.model, trial=None)

    # ---- stage 1: pairs ----
    def collect_pairs(self, iteration: int) -> list[dict]:
        """Sample `preference_num_candidates` aligned joint candidates per prompt with the current agents,
        label them with the task reward and keep the selected pairs (as JSON-ready dicts).

        With N processes, process r takes every N-th prompt from r; the pairs are then gathered and ordered by
        prompt, so every process holds the same list (the one-process list when `seed_generation_per_prompt`
        makes each prompt's samples independent of the batch)."""
        args = self.args
        rank, world = (self.args.process_index, self.args.world_size) if self._distributed else (0, 1)
        indices = list(range(rank, len(self.train_dataset), world))
        seed = args.seed + 1_000_003 * (iteration + 1)
        stream = seed if rank == 0 else prompt_seed(seed, "process", rank)  # own sampling stream per process
        M, size, pairs = args.preference_num_candidates, args.per_device_train_batch_size, []
        with seeded_stream(stream):
            for start in range(0, len(indices), size):
                batch_indices = indices[start : start + size]
                batch = [self.train_dataset[i] for i in batch_indices]
                if args.seed_generation_per_prompt:
                    self._prompt_indices, self._prompt_seed_prefix = batch_indices, ("preference", seed)
                try:
                    turn = self._roll_out(batch, M, "aligned", None, do_sample=True)[0]
                finally:
                    self._prompt_indices = self._prompt_seed_prefix = None
                for n, index in enumerate(batch_indices):
                    rewards = turn.rewards[n].tolist()
                    # one generator per prompt: the selection does not depend on which process holds the prompt
                    selection_rng = torch.Generator().manual_seed(prompt_seed(seed, "selection", index))
                    for w, l in select_pairs(rewards, args.pair_selection, args.preference_pairs_per_sample, selection_rng):
                        pairs.append({
                            "iteration": iteration, "item": index,
                            "prompts": [turn.prompts[i][n] for i in range(self.num_agents)],
                            "chosen": [r.completions[n * M + w] for r in turn.agents],
                            "rejected": [r.completions[n * M + l] for r in turn.agents],
                            "chosen_reward": rewards[w], "rejected_reward": rewards[l],
                        })
        if self._distributed:  # stable sort: a prompt's pairs keep their selection order
            pairs = sorted((p for part in self._gather_objects(pairs) for p in part), key=lambda p: p["item"])
        if not pairs:
            raise ValueError(
                f"iteration {iteration}: the task reward tied on every candidate of every prompt, so there is no "
                f"preference to learn (preference_num_candidates={args.preference_num_candidates})"
            )
        self.log({"preference/pairs": float(len(pairs)), "preference/iteration": float(iteration)})
        return pairs

    # ---- stage 2: the reward model ----
    def fit_reward_model(self, iteration: int, pairs: list[dict]) -> dict:
        """Fit a fresh reward model to `pairs` (Bradley-Terry); returns this iteration's history entry."""
        args = self.args
        seed = args.seed + 1_000_003 * (iteration + 1) + 1
        with seeded_stream(seed):
            model, tokenizer = load_reward_model(self._reward_source, self.model_config, self._reward_device, seed)
            self.reward_tokenizer = tokenizer
            if args.disable_dropout:
                disable_dropout_in_model(model)
            if args.reward_freeze_backbone:
                model.base_model.requires_grad_(False)
            trainable = [p for p in model.parameters() if p.requires_grad]
            optimizer = torch.optim.AdamW(trainable, lr=args.reward_learning_rate)
            chosen = [joint_text(p["prompts"], p["chosen"]) for p in pairs]
            rejected = [joint_text(p["prompts"], p["rejected"]) for p in pairs]
            order = torch.randperm(len(pairs)).tolist()
            held_out = math.floor(args.reward_eval_fraction * len(pairs)) if len(pairs) > 1 else 0
            eval_rows, train_rows = order[:held_out], order[held_out:]
            history = {"iteration": iteration, "pairs": len(pairs), "eval_pairs": held_out, "epochs": []}

            def accuracy(rows):
                if not rows:
                    return None
                with torch.no_grad():
                    model.eval()
                    scores = reward_scores(model, tokenizer, [chosen[r] for r in rows] + [rejected[r] for r in rows],
                                           args.reward_max_length)
                return bradley_terry_loss(scores[: len(rows)], scores[len(rows):])[1].item()

            history["eval_accuracy_before"] = accuracy(eval_rows)
            size = args.reward_train_batch_size
            for epoch in range(args.reward_num_train_epochs):
                model.train()
                shuffled = [train_rows[i] for i in torch.randperm(len(train_rows)).tolist()]
                losses, accuracies = [], []
                for start in range(0, len(shuffled), size):
                    rows = shuffled[start : start + size]
                    scores = reward_scores(model, tokenizer, [chosen[r] for r in rows] + [rejected[r] for r in rows],
                                           args.reward_max_length, batch_size=2 * size)
                    loss, acc = bradley_terry_loss(scores[: len(rows)], scores[len(rows):])
                    if not torch.isfinite(loss):
                        raise FloatingPointError(f"reward-model loss is {loss.item()} (iteration {iteration}, epoch {epoch})")
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    losses.append(loss.item())
                    accuracies.append(acc.item())
                history["epochs"].append({
                    "loss": sum(losses) / len(losses), "accuracy": sum(accuracies) / len(accuracies),
                    "eval_accuracy": accuracy(eval_rows),
                })
        model.eval().requires_grad_(False)
        # every process trained the same model from the same pairs and stream; process 0's weights make that
        # bitwise certain even where kernels are not deterministic (GPU)
        self._broadcast_parameters([model])
        self.reward_model = model
        last = history["epochs"][-1]
        logs = {"reward_model/loss": last["loss"], "reward_model/accuracy": last["accuracy"]}
        if last["eval_accuracy"] is not None:
            logs.update({"reward_model/eval_accuracy": last["eval_accuracy"],
                         "reward_model/eval_accuracy_before": history["eval_accuracy_before"]})
        self.log(logs)
        return history

    # ---- stage 3: RL against the reward model ----
    def rollout(self, batch: list[dict]):
        self._use_reward_model = True
        try:
            return super().rollout(batch)
        finally:
            self._use_reward_model = False

    def _score(self, completions: list[list[str]], items: list) -> list[float]:
        if not self._use_reward_model:
            return super()._score(completions, items)  # the task reward: pair labels and evaluation
        if self.reward_model is None:
            raise RuntimeError("the reward model is not trained yet; RL cannot start before the preference stages")
        texts = [
            joint_text([fmt(item) for fmt in self.formatters], [c[j] for c in completions]) for j, item in enumerate(items)
        ]
        with torch.no_grad():
            return reward_scores(self.reward_model, self.reward_tokenizer, texts, self.args.reward_max_length).tolist()

    # ---- saving and resuming ----
    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        """`agent_i/` (and critics) as every trainer, plus `reward_model/` once it is trained."""
        super()._save(output_dir, state_dict)
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if self.reward_model is not None and self.args.should_save:
            self.reward_model.save_pretrained(os.path.join(output_dir, REWARD_MODEL_DIR))
            self.reward_tokenizer.save_pretrained(os.path.join(output_dir, REWARD_MODEL_DIR))

    def _save_extra_state(self, staging: str) -> dict:
        with open(os.path.join(staging, PREFERENCE_STATE_NAME), "w", encoding="utf-8") as f:
            json.dump({"stage": self._stage, "history": self.preference_history}, f)
        return {"boundaries": self._boundaries, "iteration": self._stage["iteration"],
                "pairs_collected": self._stage["pairs"] is not None,
                "reward_model_trained": self._stage["reward_model_trained"]}

    def _checkpoint_count(self, kind: str) -> int:
        return self._boundaries if kind == "epoch" else super()._checkpoint_count(kind)

    def _restore_runtime(self, metadata: dict) -> None:
        super()._restore_runtime(metadata)
        self._boundaries = int(metadata["extra"]["boundaries"])

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        self._rng_checkpoint = resume_from_checkpoint
        with open(os.path.join(resume_from_checkpoint, PREFERENCE_STATE_NAME), encoding="utf-8") as f:
            saved = json.load(f)
        self._stage, self.preference_history = saved["stage"], saved["history"]
        self.reward_model = None
        if self._stage["reward_model_trained"]:
            folder = os.path.join(resume_from_checkpoint, REWARD_MODEL_DIR)
            model = AutoModelForSequenceClassification.from_pretrained(folder, **load_kwargs(self.model_config))
            self.reward_model = own_memory(model.to(self._reward_device)).eval().requires_grad_(False)
            self.reward_tokenizer = AutoTokenizer.from_pretrained(folder)

    def _write_artifact(self, iteration: int) -> None:
        """`preference/iteration_K.json` in the output folder: the pairs and the reward model's history."""
        if not self.args.should_save:
            return
        folder = os.path.join(self._artifact_dir, "preference")
        os.makedirs(folder, exist_ok=True)
        entry = next((h for h in self.preference_history if h["iteration"] == iteration), None)
        with open(os.path.join(folder, f"iteration_{iteration}.json"), "w", encoding="utf-8") as f:
            json.dump({"pairs": self._stage["pairs"], "reward_model": entry}, f)


class MARLHFIterTrainer(MARLHFTrainer):
    """MARLHF repeated `num_iterations` times: each iteration reloads the reward model from its source,
    collects pairs with the current agents, relearns preferences and runs `num_train_epochs` RL epochs.
    `num_iterations` counts the whole run and may be raised on resume."""

    config_class = MARLHFIterConfig
    algorithm_name = "MARLHFIter"

    def train(self, *args, **kwargs):
        per_iteration = self.args.num_train_epochs
        self._per_iteration_epochs = int(per_iteration)
        self.args.num_train_epochs = per_iteration * self.args.num_iterations  # the Trainer's whole-run total
        try:
            return super().train(*args, **kwargs)
        finally:
            self.args.num_train_epochs = per_iteration

    def iteration_of(self, epoch: int) -> int:
        return epoch // self._per_iteration_epochs
