"""Spec §6: train two agents for 2 epochs, then continue the same run (and the same W&B run) to 4 epochs.

    WANDB_MODE=offline python examples/resume_wandb.py [--model DIR_OR_ID] [--workdir DIR]

Without --model it uses a tiny random Qwen2-shaped model, so it runs offline in seconds. Both parts log
against env_step into one W&B run; the second part resumes from the latest checkpoint.
"""

import argparse
import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

import wandb
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl_hf.rewards import length_ratio_reward
from comlrl_hf.testing import save_tiny_model
from comlrl_hf.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from comlrl_hf.utils import read_checkpoint_metadata


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None)
    parser.add_argument("--workdir", default=None, help="default: a new temporary folder")
    args = parser.parse_args()
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="comlrl_hf_resume_demo-")
    os.makedirs(args.workdir, exist_ok=True)
    model_name = args.model or save_tiny_model(os.path.join(args.workdir, "tiny-qwen2"), "qwen2")
    tokenizer = AutoTokenizer.from_pretrained(model_name)
    train_dataset = Dataset.from_dict({"prompt": [
        "Describe a city in the clouds:", "Invent a new holiday and explain it:",
        "Write a bedtime story for a dragon:", "Design a playground on Mars:"]})

    def build_trainer(num_train_epochs, wandb_config):
        config = MAGRPOConfig(output_dir=os.path.join(args.workdir, "out"), num_turns=1,
                              num_train_epochs=num_train_epochs, num_generations=4, max_new_tokens=64,
                              logging_steps=1)
        return MAGRPOTrainer(
            agents=[AutoModelForCausalLM.from_pretrained(model_name) for _ in range(2)],
            tokenizer=tokenizer, reward_func=length_ratio_reward,
            train_dataset=train_dataset, args=config, wandb_config=wandb_config)

    checkpoint_dir = os.path.join(args.workdir, "checkpoints", "resume-demo")
    wandb_config = {"project": "comlrl-examples", "name": "resume-demo", "dir": args.workdir}
    trainer = build_trainer(2, wandb_config)
    trainer.train(checkpoint_dir=checkpoint_dir, checkpoint_interval=1)  # -> checkpoint-1 and checkpoint-2
    wandb.finish()  # as if this process ended here

    checkpoint = max(Path(checkpoint_dir).glob("checkpoint-*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))
    identity = read_checkpoint_metadata(checkpoint)["wandb"]
    if identity:
        wandb_config = {**wandb_config, **identity, "resume": "allow"}
    trainer = build_trainer(4, wandb_config)
    trainer.train(resume_from_checkpoint=str(checkpoint), checkpoint_dir=checkpoint_dir, checkpoint_interval=1)
    print("W&B run", identity["id"], "env_step", trainer.env_step, "checkpoints", sorted(os.listdir(checkpoint_dir)))
    wandb.finish()


if __name__ == "__main__":
    main()
