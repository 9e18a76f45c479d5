"""Checkpoints: bitwise resume (epoch and mid-epoch), compatibility checks, integrity, rotation, state."""

import json
import os

import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback

from comlrl_hf import MAGRPOConfig, MAGRPOTrainer, MARLOOConfig, MARLOOTrainer
from comlrl_hf.utils import CheckpointError, read_checkpoint_metadata

from conftest import PROMPTS, length_ratio_reward


def _build(dirs, epochs, cls=MAGRPOTrainer, config_cls=MAGRPOConfig, dataset=None, callbacks=None, **kw):
    settings = dict(output_dir="out", num_train_epochs=epochs, max_new_tokens=8, logging_steps=1, report_to=[],
                    agent_learning_rate=1e-3, disable_tqdm=True)
    config = config_cls(**{**settings, **kw})
    return cls(agents=list(dirs), reward_func=length_ratio_reward, callbacks=callbacks,
               train_dataset=dataset if dataset is not None else Dataset.from_dict({"prompt": PROMPTS}), args=config)


def _step_logs(trainer):
    return [log for log in trainer.state.log_history if "loss" in log]


def _same_weights(a, b):
    return all(torch.equal(x, y) for m, n in zip(a.agents, b.agents) for x, y in zip(m.state_dict().values(), n.state_dict().values()))


def _same_optimizer(a, b):
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    return sa["param_groups"] == sb["param_groups"] and all(
        torch.equal(sa["state"][k][n], sb["state"][k][n]) for k in sa["state"] for n in sa["state"][k]
    )


@pytest.fixture()
def dirs(llama_dir, qwen_dir):
    return [llama_dir, qwen_dir]


@pytest.fixture()
def full_run(dirs):
    trainer = _build(dirs, 2)
    trainer.train(checkpoint_dir="full", checkpoint_interval=1)
    return trainer


def test_epoch_resume_is_bitwise(dirs, full_run):
    assert sorted(os.listdir("full")) == ["checkpoint-1", "checkpoint-2"]
    first = _build(dirs, 1)
    first.train(checkpoint_dir="ck", checkpoint_interval=1)
    assert read_checkpoint_metadata("ck/checkpoint-1")["env_step"] == first.env_step == 16
    resumed = _build(dirs, 2)  # a fresh trainer: same models, data, settings; two epochs in total
    resumed.train(resume_from_checkpoint="ck/checkpoint-1", checkpoint_dir="ck", checkpoint_interval=1)
    assert _same_weights(full_run, resumed) and _same_optimizer(full_run, resumed)
    assert _step_logs(full_run) == _step_logs(resumed)
    assert resumed.env_step == full_run.env_step == 32
    assert sorted(os.listdir("ck")) == ["checkpoint-1", "checkpoint-2"]


def test_mid_epoch_step_checkpoint_resume_is_bitwise(dirs, full_run):
    steps = _build(dirs, 2, save_strategy="steps", save_steps=1)
    steps.train()
    assert {"checkpoint-step-1", "checkpoint-step-3"} <= set(os.listdir("out"))
    resumed = _build(dirs, 2, save_strategy="steps", save_steps=1)
    resumed.train(resume_from_checkpoint="out/checkpoint-step-3")  # inside epoch 2
    assert _same_weights(full_run, resumed) and _same_optimizer(full_run, resumed)
    assert _step_logs(full_run) == _step_logs(resumed)


def test_more_epochs_continue_and_a_finished_run_trains_nothing(dirs, full_run):
    again = _build(dirs, 2)
    again.train(resume_from_checkpoint=True, checkpoint_dir="full")
    assert again.state.global_step == 4 and _same_weights(full_run, again)
    assert len(_step_logs(again)) == 4  # no new step was trained
    longer = _build(dirs, 3)
    longer.train(resume_from_checkpoint=True, checkpoint_dir="full", checkpoint_interval=1)
    assert longer.state.global_step == 6 and longer.env_step == 48
    assert "checkpoint-3" in os.listdir("full")


def test_incompatible_resume_fails_before_any_state_changes(dirs, qwen_dir, full_run):
    cases = [
        (dict(max_new_tokens=9), "config max_new_tokens: checkpoint 8, now 9"),
        (dict(agent_learning_rate=2e-3), "config agent_learning_rate"),
        (dict(dataset=Dataset.from_dict({"prompt": PROMPTS[:3]})), "dataset: checkpoint"),
        (dict(dirs=[qwen_dir, qwen_dir]), "agents: checkpoint"),
        (dict(cls=MARLOOTrainer, config_cls=MARLOOConfig), "was written by .*MAGRPOTrainer, not .*MARLOOTrainer"),
    ]
    for kw, message in cases:
        trainer = _build(kw.pop("dirs", dirs), 3, **kw)
        before = [p.detach().clone() for p in trainer.agents[0].parameters()]
        with pytest.raises(CheckpointError, match=message):
            trainer.train(resume_from_checkpoint="full/checkpoint-2")
        assert trainer.env_step == 0 and trainer.state.global_step == 0
        assert all(torch.equal(a, b) for a, b in zip(before, trainer.agents[0].parameters()))
    # allowed changes: epochs, logging interval, evaluation sampling
    ok = _build(dirs, 3, logging_steps=2, eval_do_sample=True)
    ok.train(resume_from_checkpoint="full/checkpoint-2")
    assert ok.state.global_step == 6


def test_tampered_or_truncated_checkpoints_give_clear_errors(dirs, full_run):
    with open("full/checkpoint-1/optimizer.pt", "r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01\x02")
    with pytest.raises(CheckpointError, match="optimizer.pt does not match its recorded sha256"):
        _build(dirs, 2).train(resume_from_checkpoint="full/checkpoint-1")
    os.remove("full/checkpoint-2/agent_1/model.safetensors")
    with pytest.raises(CheckpointError, match="agent_1/model.safetensors is missing"):
        _build(dirs, 2).train(resume_from_checkpoint="full/checkpoint-2")
    state_file = "full/checkpoint-2/comlrl_state.json"
    text = open(state_file).read()
    open(state_file, "w").write(text[: len(text) // 2])
    with pytest.raises(CheckpointError, match="unreadable or truncated"):
        read_checkpoint_metadata("full/checkpoint-2")
    with pytest.raises(CheckpointError, match="holds no complete checkpoint"):
        _build(dirs, 2).train(resume_from_checkpoint=True, checkpoint_dir="empty")


def test_checkpoint_total_limit_keeps_the_newest(dirs):
    trainer = _build(dirs, 3)
    trainer.train(checkpoint_dir="ck", checkpoint_interval=1, checkpoint_total_limit=2)
    assert sorted(os.listdir("ck")) == ["checkpoint-2", "checkpoint-3"]
    with pytest.raises(ValueError, match="checkpoint_interval must be a positive integer, got 0"):
        trainer.train(checkpoint_dir="ck", checkpoint_interval=0)


class CountingDataset(torch.utils.data.Dataset):
    def __init__(self):
        self.reads = 0

    def __len__(self):
        return len(PROMPTS)

    def __getitem__(self, i):
        self.reads += 1
        return {"prompt": PROMPTS[i]}

    def state_dict(self):
        return {"reads": self.reads}

    def load_state_dict(self, state):
        self.reads = state["reads"]


class CountingCallback(TrainerCallback):
    def __init__(self):
        self.steps = 0

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1

    def state_dict(self):
        return {"steps": torch.tensor(self.steps)}

    def load_state_dict(self, state):
        self.steps = int(state["steps"])


def test_stateful_dataset_and_callback_are_restored(dirs):
    dataset, callback = CountingDataset(), CountingCallback()
    _build(dirs, 1, dataset=dataset, callbacks=[callback]).train(checkpoint_dir="ck", checkpoint_interval=1)
    assert callback.steps == 2 and dataset.reads > 0
    fresh_dataset, fresh_callback = CountingDataset(), CountingCallback()
    resumed = _build(dirs, 2, dataset=fresh_dataset, callbacks=[fresh_callback])
    resumed.train(resume_from_checkpoint="ck/checkpoint-1")
    assert fresh_callback.steps == 4
    assert fresh_dataset.reads >= dataset.reads
    metadata = read_checkpoint_metadata("ck/checkpoint-1")
    assert metadata["wandb"] is None and metadata["kind"] == "epoch" and metadata["boundary"] == 1
    stateful = metadata["fingerprint"]["stateful"]
    assert "train_dataset" in stateful and any(name.endswith(".CountingCallback") for name in stateful)
    assert json.load(open("ck/checkpoint-1/trainer_state.json"))["global_step"] == 2


class StatefulReward:
    """A reward with state (e.g. a running normaliser): saved and restored with checkpoints."""

    def __init__(self):
        self.calls = 0

    def __call__(self, completions1, completions2):
        self.calls += 1
        return length_ratio_reward(completions1, completions2)

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.calls = state["calls"]


def test_stateful_reward_function_is_restored(dirs):
    reward = StatefulReward()
    MAGRPOTrainer(agents=dirs, reward_func=reward, train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                  args=MAGRPOConfig(output_dir="out", num_train_epochs=1, max_new_tokens=4, report_to=[])
                  ).train(checkpoint_dir="ck")
    fresh = StatefulReward()
    resumed = MAGRPOTrainer(agents=dirs, reward_func=fresh, train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                            args=MAGRPOConfig(output_dir="out", num_train_epochs=2, max_new_tokens=4, report_to=[]))
    resumed.train(resume_from_checkpoint="ck/checkpoint-1")
    assert reward.calls == 2 and fresh.calls == 4
    assert "reward_func" in read_checkpoint_metadata("ck/checkpoint-1")["fingerprint"]["stateful"]


def test_a_fresh_run_refuses_a_folder_holding_another_runs_checkpoints(dirs, full_run):
    with pytest.raises(CheckpointError, match="full already holds checkpoints of another run"):
        _build(dirs, 2).train(checkpoint_dir="full", checkpoint_interval=1)
    full_run.train(checkpoint_dir="full", checkpoint_interval=1)  # the same run may write there again


def test_resume_between_two_logs_keeps_the_logged_values(dirs):
    """A checkpoint at step 3 with logging every 2 steps: the log at step 4 averages steps 3 and 4 both ways."""
    full = _build(dirs, 2, logging_steps=2)
    full.train()
    steps = _build(dirs, 2, logging_steps=2, save_strategy="steps", save_steps=3)
    steps.train()
    resumed = _build(dirs, 2, logging_steps=2, save_strategy="steps", save_steps=3)
    resumed.train(resume_from_checkpoint="out/checkpoint-step-3")
    assert _step_logs(full) == _step_logs(resumed) and len(_step_logs(full)) == 2


class NumpyStateCallback(TrainerCallback):
    def state_dict(self):
        import numpy as np

        return {"rng": np.random.get_state()}

    def load_state_dict(self, state):
        pass


def test_unloadable_user_state_is_refused_when_saving(dirs):
    trainer = _build(dirs, 1, callbacks=[NumpyStateCallback()])
    with pytest.raises(CheckpointError, match="holds objects a weights_only load cannot restore"):
        trainer.train(checkpoint_dir="ck")
    assert not [n for n in os.listdir("ck") if not n.startswith(".")]


def test_a_checkpoint_replaced_mid_publish_is_put_back(dirs, full_run):
    os.replace("full/checkpoint-2", "full/.old-checkpoint-2-deadbeef")  # crash between the two renames
    os.makedirs("full/.tmp-checkpoint-2-cafebabe")
    resumed = _build(dirs, 2)
    resumed.train(resume_from_checkpoint=True, checkpoint_dir="full")
    assert sorted(os.listdir("full")) == ["checkpoint-1", "checkpoint-2"]
    assert resumed.state.global_step == 4 and _same_weights(full_run, resumed)


def test_a_run_stopped_mid_epoch_gets_a_step_checkpoint(dirs):
    _build(dirs, 2, max_steps=3).train(checkpoint_dir="ck", checkpoint_interval=1)
    assert sorted(os.listdir("ck")) == ["checkpoint-1", "checkpoint-step-3"]
