"""One process of the data-parallel test (tests/test_ddp.py), launched with `torch.distributed.run`.

    python -m torch.distributed.run --nproc_per_node 2 tests/ddp_worker.py OUT LLAMA_DIR QWEN_DIR LOSS_TYPE

Trains MAGRPO for two epochs with a checkpoint per epoch (run "full"), then a fresh trainer resumes from
checkpoint-1 (run "resumed"); every process writes its final weights and logs to OUT.
"""

import json
import os
import sys

import torch
from datasets import Dataset

from comlrl_hf import MAGRPOConfig, MAGRPOTrainer
from comlrl_hf.rewards import length_ratio_reward

PROMPTS = [
    "Describe a city in the clouds:", "Invent a new holiday and explain it:", "Write a bedtime story for a dragon:",
    "Design a playground on Mars:", "Name three colours of the sea:", "Plan a picnic for robots:",
    "Explain rain to a fish:", "Sing about a lost sock:",
]
GLOBAL_BATCH = 4  # prompts per optimizer step, over all processes


def build(dirs, epochs, world_size, loss_type):
    args = MAGRPOConfig(
        output_dir="out", num_train_epochs=epochs, max_new_tokens=8, logging_steps=1, report_to=[], disable_tqdm=True,
        agent_learning_rate=1e-3, per_device_train_batch_size=GLOBAL_BATCH // world_size, num_generations=4,
        loss_type=loss_type, seed_generation_per_prompt=True,
    )
    return MAGRPOTrainer(agents=list(dirs), reward_func=length_ratio_reward,
                         train_dataset=Dataset.from_dict({"prompt": PROMPTS}), args=args)


def snapshot(trainer) -> dict:
    return {f"agent_{i}.{n}": p.detach().clone() for i, a in enumerate(trainer.agents) for n, p in a.state_dict().items()}


def step_logs(trainer) -> list:
    return [{k: v for k, v in log.items() if k not in ("train_runtime",)} for log in trainer.state.log_history if "loss" in log]


def main(out, llama_dir, qwen_dir, loss_type):
    torch.set_num_threads(1)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    os.makedirs(out, exist_ok=True)
    os.chdir(out)
    dirs = [llama_dir, qwen_dir]
    full = build(dirs, 2, world, loss_type)
    assert full.args.world_size == world, (full.args.world_size, world)
    full.train(checkpoint_dir="full", checkpoint_interval=1)
    resumed = build(dirs, 2, world, loss_type)
    resumed.train(resume_from_checkpoint="full/checkpoint-1", checkpoint_dir="full", checkpoint_interval=1)
    torch.save({"full": snapshot(full), "resumed": snapshot(resumed),
                "full_optimizer": full.optimizer.state_dict(), "resumed_optimizer": resumed.optimizer.state_dict()},
               f"weights_rank{rank}.pt")
    with open(f"logs_rank{rank}.json", "w") as f:
        json.dump({"full": step_logs(full), "resumed": step_logs(resumed), "env_step": [full.env_step, resumed.env_step],
                   "files": sorted(os.listdir("full/checkpoint-1"))}, f)


if __name__ == "__main__":
    main(*sys.argv[1:5])
