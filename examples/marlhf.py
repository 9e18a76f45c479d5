"""MARLHF / MARLHFIter on two tiny heterogeneous agents, offline: learn a joint reward model from pairs
labelled by a rule-based task reward, then train the agents against it.

    python examples/marlhf.py [--iterations 1] [--rl-algorithm magrpo|marloo|iac|maac] [--out DIR]

Prints the reward model's held-out accuracy (before -> after), the reward-model score during RL, and the
*task* reward of greedy evaluation before and after training; then saves agent_i/ and reward_model/.
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
from comlrl_hf.trainers.preference import MARLHFConfig, MARLHFIterConfig, MARLHFIterTrainer, MARLHFTrainer

PROMPTS = [f"Prompt {i}: describe something you like" for i in range(8)]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=1, help="1: MARLHFTrainer; more: MARLHFIterTrainer")
    parser.add_argument("--rl-algorithm", default="magrpo", choices=["magrpo", "mareinforce", "maremax", "marloo", "iac", "maac"])
    parser.add_argument("--epochs", type=int, default=6, help="RL epochs (per iteration)")
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "comlrl_hf_marlhf"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    agents = [save_tiny_model(os.path.join(args.out, "base", arch), arch) for arch in ("llama", "qwen2")]
    dataset = Dataset.from_dict({"prompt": PROMPTS})
    settings = dict(
        output_dir=os.path.join(args.out, "run"), num_train_epochs=args.epochs, rl_algorithm=args.rl_algorithm,
        num_generations=8 if args.rl_algorithm not in ("iac", "maac") else 2, max_new_tokens=12, temperature=1.0,
        top_p=1.0, top_k=None, agent_learning_rate=3e-3, critic_learning_rate=3e-3, logging_steps=1, report_to=[],
        disable_tqdm=True, seed=0, per_device_train_batch_size=4,
        # preferences: 16 joint candidates per prompt, 24 random pairs each, a quarter held out
        preference_num_candidates=16, preference_pairs_per_sample=24, pair_selection="random",
        reward_model_name=agents[0], reward_model_device=None, reward_learning_rate=1e-3,
        reward_num_train_epochs=3, reward_train_batch_size=16, reward_eval_fraction=0.25,
    )
    if args.iterations > 1:
        config, trainer_cls = MARLHFIterConfig(num_iterations=args.iterations, **settings), MARLHFIterTrainer
    else:
        config, trainer_cls = MARLHFConfig(**settings), MARLHFTrainer
    trainer = trainer_cls(agents=agents, tokenizer=[AutoTokenizer.from_pretrained(a) for a in agents],
                          reward_func=space_share_reward, train_dataset=dataset, eval_dataset=dataset, args=config)
    before = trainer.evaluate()["eval_reward"]
    trainer.train()
    after = trainer.evaluate()["eval_reward"]
    for entry in trainer.preference_history:
        print(f"iteration {entry['iteration']}: {entry['pairs']} pairs, reward-model held-out accuracy "
              f"{entry['eval_accuracy_before']:.2f} -> {entry['epochs'][-1]['eval_accuracy']:.2f}")
    scores = [log["reward"] for log in trainer.state.log_history if "reward" in log]
    quarter = max(1, len(scores) // 4)
    print(f"reward-model score during RL: first quarter {sum(scores[:quarter]) / quarter:.3f}, "
          f"last quarter {sum(scores[-quarter:]) / quarter:.3f}")
    print(f"task reward (greedy evaluation): before {before:.3f}, after {after:.3f}")
    trainer.save_model(os.path.join(args.out, "saved"))
    print("saved:", sorted(os.listdir(os.path.join(args.out, "saved"))))


if __name__ == "__main__":
    main()
