"""Cost of each MARLHF stage on a fixed workload: pair collection, reward-model training, RL steps.

    python benchmarks/marlhf_stages.py --model tiny
    python benchmarks/marlhf_stages.py --model smollm2 [--freeze-backbone]

Workload: 2 agents, `--prompts` prompts, M = `--candidates` joint candidates per prompt with every completion
exactly `--tokens` long, `--pairs` pairs kept per prompt, one reward-model epoch, then `--steps` MAGRPO steps
(K = 4) against the reward model. Prints seconds per stage, pairs/s of reward-model training, env-steps/s of RL,
the reward model's held-out accuracy, and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from comlrl_hf.rewards import length_ratio_reward  # noqa: E402
from comlrl_hf.trainers.preference import MARLHFConfig, MARLHFTrainer  # noqa: E402

from magrpo_step import PROMPTS, model_pair  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--candidates", type=int, default=8)
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--freeze-backbone", action="store_true")
    args = p.parse_args(argv)
    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as workdir:
        paths, label = model_pair(args.model, workdir)
        dataset = Dataset.from_dict({"prompt": (PROMPTS * args.prompts)[: args.prompts]})
        config = MARLHFConfig(
            output_dir=os.path.join(workdir, "out"), num_train_epochs=1, max_steps=args.steps, num_generations=4,
            max_new_tokens=args.tokens, min_new_tokens=args.tokens, per_device_train_batch_size=2,
            preference_num_candidates=args.candidates, preference_pairs_per_sample=args.pairs,
            reward_model_device=None, reward_learning_rate=1e-5, reward_train_batch_size=8,
            reward_freeze_backbone=args.freeze_backbone, reward_eval_fraction=0.25,
            report_to=[], disable_tqdm=True, logging_steps=1, save_strategy="no",
        )
        trainer = MARLHFTrainer(agents=paths, reward_func=length_ratio_reward, train_dataset=dataset, args=config)
        seconds, results = {}, {}
        for name in ("collect_pairs", "fit_reward_model"):
            def timed(*a, _inner=getattr(trainer, name), _name=name, **k):
                begin = time.perf_counter()
                results[_name] = _inner(*a, **k)
                seconds[_name] = time.perf_counter() - begin
                return results[_name]
            setattr(trainer, name, timed)
        start = time.perf_counter()
        trainer.train()
        total = time.perf_counter() - start
    pairs, history = results["collect_pairs"], results["fit_reward_model"]
    collected, fitted = seconds["collect_pairs"], seconds["fit_reward_model"]
    train_pairs = len(pairs) - history["eval_pairs"]
    rl_seconds = total - collected - fitted
    env_steps = trainer.env_step
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"model: {label}; {args.prompts} prompts x {args.candidates} candidates x {args.tokens} tokens, "
          f"{len(pairs)} pairs, freeze_backbone={args.freeze_backbone}, threads={torch.get_num_threads()}")
    print(f"| stage | seconds | rate |\n|---|---|---|")
    print(f"| 1. pairs | {collected:.1f} | {args.prompts * args.candidates / collected:.2f} joint candidates/s |")
    print(f"| 2. reward model (1 epoch) | {fitted:.1f} | {train_pairs / fitted:.2f} pairs/s |")
    print(f"| 3. RL ({args.steps} MAGRPO steps) | {rl_seconds:.1f} | {env_steps / rl_seconds:.2f} env-steps/s |")
    print(f"held-out accuracy {history['eval_accuracy_before']} -> {history['epochs'][-1]['eval_accuracy']}; "
          f"peak RSS {peak:.0f} MiB")


if __name__ == "__main__":
    main()
