"""Spec §6 with WANDB_MODE=offline: both parts in one run, monotone env_step, identity in checkpoints."""

import os
from pathlib import Path

import pytest
import wandb
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl_hf import MAGRPOConfig, MAGRPOTrainer
from comlrl_hf.utils import read_checkpoint_metadata

from conftest import length_ratio_reward
from wandb_files import history, run_files, run_id


def _finish():
    """Finish the run and wait until the W&B service has written every record."""
    wandb.run.finish()
    wandb.teardown()


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    yield
    if wandb.run is not None:
        wandb.run.finish()


def test_spec_6_train_then_continue_in_the_same_run(qwen_dir, tmp_path):
    model_name = qwen_dir
    tokenizer = AutoTokenizer.from_pretrained(model_name)
    train_dataset = Dataset.from_dict({"prompt": [
        "Describe a city in the clouds:", "Invent a new holiday and explain it:",
        "Write a bedtime story for a dragon:", "Design a playground on Mars:"]})

    def build_trainer(num_train_epochs, wandb_config):
        config = MAGRPOConfig(num_turns=1, num_train_epochs=num_train_epochs,
                              num_generations=4, max_new_tokens=64, logging_steps=1)
        return MAGRPOTrainer(
            agents=[AutoModelForCausalLM.from_pretrained(model_name) for _ in range(2)],
            tokenizer=tokenizer, reward_func=length_ratio_reward,
            train_dataset=train_dataset, args=config, wandb_config=wandb_config)

    checkpoint_dir = "./checkpoints/resume-demo"
    wandb_config = {"project": "comlrl-examples", "name": "resume-demo", "dir": str(tmp_path)}
    trainer = build_trainer(2, wandb_config)
    assert wandb.run is None  # no run is opened at construction
    trainer.train(checkpoint_dir=checkpoint_dir, checkpoint_interval=1)
    assert sorted(os.listdir(checkpoint_dir)) == ["checkpoint-1", "checkpoint-2"]
    first_id = wandb.run.id
    wandb.run.finish()  # as if the first process had ended

    checkpoint = max(Path(checkpoint_dir).glob("checkpoint-*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))
    identity = read_checkpoint_metadata(checkpoint)["wandb"]
    assert identity == {"id": first_id, "project": "comlrl-examples", "entity": identity["entity"]}
    if identity:
        wandb_config = {**wandb_config, **identity, "resume": "allow"}
    trainer = build_trainer(4, wandb_config)
    trainer.train(resume_from_checkpoint=str(checkpoint), checkpoint_dir=checkpoint_dir, checkpoint_interval=1)
    assert wandb.run.id == first_id
    assert read_checkpoint_metadata(Path(checkpoint_dir) / "checkpoint-4")["wandb"]["id"] == first_id
    _finish()

    files = run_files(tmp_path)
    assert {run_id(f) for f in files} == {first_id}  # both parts land in one run
    env_steps = [row["env_step"] for f in files for row in history(f) if "env_step" in row]
    assert env_steps == sorted(env_steps) and len(env_steps) == len(set(env_steps))
    assert env_steps[-1] == 4 * 4 * 4  # 4 epochs x 4 prompts x 4 generations
    rewards = [row for f in files for row in history(f) if "train/reward" in row]
    assert len(rewards) == 8 and all(row["_step"] == row["env_step"] for row in rewards)


def test_resuming_an_older_checkpoint_logs_no_duplicates(qwen_dir, tmp_path, dataset):
    """Steps were logged past checkpoint-1 before the "interruption": W&B keeps the run's step axis, so the
    re-done steps below the last logged one are not logged twice. (Offline, each process writes its own run
    file and only the W&B server knows the last step, so this runs in one process with the run still open.)"""
    config = dict(num_train_epochs=2, max_new_tokens=4, logging_steps=1)
    trainer = MAGRPOTrainer(agent_model=qwen_dir, reward_func=length_ratio_reward, train_dataset=dataset,
                            args=MAGRPOConfig(**config), wandb_config={"project": "p", "dir": str(tmp_path)})
    trainer.train(checkpoint_dir="ck")
    identity = read_checkpoint_metadata("ck/checkpoint-1")["wandb"]
    resumed = MAGRPOTrainer(agent_model=qwen_dir, reward_func=length_ratio_reward, train_dataset=dataset,
                            args=MAGRPOConfig(**{**config, "num_train_epochs": 3}),
                            wandb_config={"project": "p", "dir": str(tmp_path), **identity, "resume": "allow"})
    resumed.train(resume_from_checkpoint="ck/checkpoint-1", checkpoint_dir="ck")
    _finish()
    (run_file,) = run_files(tmp_path)
    steps = [row["env_step"] for row in history(run_file) if "train/reward" in row]
    assert steps == [8, 16, 24, 32, 40, 48]


def test_report_to_wandb_alone_also_logs_on_env_step(qwen_dir, tmp_path, dataset):
    trainer = MAGRPOTrainer(agent_model=qwen_dir, reward_func=length_ratio_reward, train_dataset=dataset,
                            args=MAGRPOConfig(num_train_epochs=1, max_new_tokens=4, logging_steps=1, report_to=["wandb"]))
    trainer.train()
    _finish()
    rows = [row for f in run_files(tmp_path) for row in history(f) if "train/reward" in row]
    assert [row["env_step"] for row in rows] == [8, 16]


def test_wandb_config_is_checked_at_construction(qwen_dir, dataset):
    with pytest.raises(ValueError, match=r"wandb_config has unknown keys \['projekt'\]"):
        MAGRPOTrainer(agent_model=qwen_dir, reward_func=length_ratio_reward, train_dataset=dataset,
                      args=MAGRPOConfig(), wandb_config={"projekt": "x"})
