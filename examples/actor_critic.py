"""IAC (separate or shared critics) and MAAC on two tiny heterogeneous agents, offline, in seconds.

    python examples/actor_critic.py [--trainer iac|iac-shared|maac] [--out DIR]

Prints the joint reward and the value loss per step, then saves the agents and critics (spec §4.3 layout).
"""

import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from datasets import Dataset
from transformers import AutoTokenizer

from comlrl_hf.rewards import space_share_reward
from comlrl_hf.testing import save_tiny_model
from comlrl_hf.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer

PROMPTS = ["Describe a city in the clouds:", "Invent a new holiday and explain it:",
           "Write a bedtime story for a dragon:", "Design a playground on Mars:"]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trainer", default="iac", choices=["iac", "iac-shared", "maac"])
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "comlrl_hf_actor_critic"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    agents = [save_tiny_model(os.path.join(args.out, "base", arch), arch) for arch in ("llama", "qwen2")]
    tokenizers = [AutoTokenizer.from_pretrained(path) for path in agents]
    settings = dict(output_dir=os.path.join(args.out, "run"), num_train_epochs=8, num_generations=8, max_new_tokens=12,
                    temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=3e-3, critic_learning_rate=3e-3,
                    logging_steps=1, report_to=[], disable_tqdm=True, seed=0)
    common = dict(agents=agents, tokenizer=tokenizers, reward_func=space_share_reward,
                  train_dataset=Dataset.from_dict({"prompt": PROMPTS * 2}))
    if args.trainer == "maac":
        trainer = MAACTrainer(critic_model=agents[1], args=MAACConfig(**settings), **common)
        value_key = "critic/value_loss"
    else:
        separate = args.trainer == "iac"
        trainer = IACTrainer(critics=agents if separate else None,
                             args=IACConfig(use_separate_critic=separate, **settings), **common)
        value_key = "agent_1/value_loss"
    trainer.train()
    for log in trainer.state.log_history:
        if "reward" in log:
            print(f"env_step {log['env_step']:>4}  reward {log['reward']:.3f}  {value_key} {log[value_key]:.4f}")
    trainer.save_model(os.path.join(args.out, "saved"))
    for root, _, files in sorted(os.walk(os.path.join(args.out, "saved"))):
        print(os.path.relpath(root, args.out), sorted(f for f in files if f.endswith((".pt", ".safetensors"))))


if __name__ == "__main__":
    main()
