"""Train two tiny heterogeneous agents (Llama + Qwen2 shapes, two tokenizers) fully offline, in seconds.

    python examples/quickstart_tiny.py [--out DIR]

The reward asks both agents to use many spaces, something even random tiny models learn in a few dozen
steps; the script prints the reward per step and saves the agents.
"""

import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from datasets import Dataset

from comlrl_hf.rewards import space_share_reward
from comlrl_hf.testing import save_tiny_model
from comlrl_hf.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

PROMPTS = ["Describe a city in the clouds:", "Invent a new holiday and explain it:",
           "Write a bedtime story for a dragon:", "Design a playground on Mars:"]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "comlrl_hf_quickstart"))
    parser.add_argument("--epochs", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    models = [save_tiny_model(os.path.join(args.out, "base", arch), arch) for arch in ("llama", "qwen2")]
    trainer = MAGRPOTrainer(
        agents=models,
        reward_func=space_share_reward,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS * 2}),
        args=MAGRPOConfig(output_dir=os.path.join(args.out, "run"), num_train_epochs=args.epochs, num_generations=8,
                          max_new_tokens=12, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=3e-3,
                          logging_steps=1, report_to=[], disable_tqdm=True, seed=0),
    )
    trainer.train()
    rewards = [log["reward"] for log in trainer.state.log_history if "reward" in log]
    print("reward per step:", " ".join(f"{r:.3f}" for r in rewards))
    quarter = max(1, len(rewards) // 4)
    print(f"first quarter {sum(rewards[:quarter]) / quarter:.3f} -> last quarter {sum(rewards[-quarter:]) / quarter:.3f}")
    trainer.save_model(os.path.join(args.out, "saved"))
    print("saved to", os.path.join(args.out, "saved"))


if __name__ == "__main__":
    main()
