"""Peak memory of LoRA agents: N=1 against N=4 agents on one shared base (and N=4 separate bases for contrast).

    python benchmarks/peft_memory.py --model tiny
    python benchmarks/peft_memory.py --model smollm2      # SmolLM2-135M-Instruct (see examples/smollm2.py)

Each configuration runs in its own subprocess (peak RSS, `ru_maxrss`, is per process and never goes down):
build a MAGRPO trainer with `peft_config=LoraConfig(r=8, q/k/v/o)` and train `--steps` optimizer steps
(2 prompts x K=2 samples per agent, `--tokens` new tokens). Printed: peak RSS in MiB, the ratio to N=1, and
on a GPU the peak CUDA memory. The issue's target: N=4 shared-base <= 1.2 x N=1. No figure here is asserted
by a test.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = [(1, "shared"), (4, "shared"), (4, "separate")]
PROMPTS = ["Describe a city in the clouds:", "Invent a new holiday and explain it:",
           "Write a bedtime story for a dragon:", "Design a playground on Mars:"]


def model_path(name: str, workdir: str) -> str:
    if name == "smollm2":
        sys.path.insert(0, os.path.join(ROOT, "examples"))
        from smollm2 import smollm2_dir

        return smollm2_dir()
    from comlrl_hf.testing import save_tiny_model

    return save_tiny_model(os.path.join(workdir, "tiny-qwen2"), "qwen2")


def worker(args) -> None:
    import torch
    from datasets import Dataset
    from peft import LoraConfig

    from comlrl_hf import MAGRPOConfig, MAGRPOTrainer

    torch.manual_seed(0)

    def reward(*completions):
        return [float(sum(len(c) for c in joint)) / 100 for joint in zip(*completions)]

    with tempfile.TemporaryDirectory() as out:
        trainer = MAGRPOTrainer(
            agent_model=args.path, num_agents=args.agents, reward_func=reward, peft_backend=args.backend,
            peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
            train_dataset=Dataset.from_dict({"prompt": PROMPTS[: 2 * args.steps]}),
            args=MAGRPOConfig(output_dir=out, num_train_epochs=1, per_device_train_batch_size=2, num_generations=2,
                              max_new_tokens=args.tokens, report_to=[], disable_tqdm=True, logging_steps=1000),
        )
        trainer.train()
    peak = {"rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if torch.cuda.is_available():
        peak["cuda_mib"] = torch.cuda.max_memory_allocated() / 2**20
    print("RESULT " + json.dumps(peak), flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--path", help=argparse.SUPPRESS)
    p.add_argument("--agents", type=int, help=argparse.SUPPRESS)
    p.add_argument("--backend", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    with tempfile.TemporaryDirectory() as workdir:
        path = model_path(args.model, workdir)
        results = {}
        for agents, backend in CONFIGS:
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--path", path, "--agents", str(agents),
                   "--backend", backend, "--steps", str(args.steps), "--tokens", str(args.tokens)]
            done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if done.returncode or not lines:
                raise SystemExit(f"N={agents} {backend} failed:\n{done.stderr[-3000:]}")
            results[(agents, backend)] = json.loads(lines[-1][len("RESULT "):])
    one = results[(1, "shared")]
    print(f"model={args.model} steps={args.steps} tokens={args.tokens} LoRA r=8 on q/k/v/o")
    for (agents, backend), peak in results.items():
        line = f"  N={agents} {backend:8s} peak RSS {peak['rss_mib']:8.0f} MiB  ({peak['rss_mib'] / one['rss_mib']:.2f} x N=1)"
        if "cuda_mib" in peak:
            line += f"  peak CUDA {peak['cuda_mib']:8.0f} MiB ({peak['cuda_mib'] / one['cuda_mib']:.2f} x N=1)"
        print(line)


if __name__ == "__main__":
    main()
