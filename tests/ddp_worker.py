"""One process of the data-parallel tests (tests/test_ddp.py), launched with `torch.distributed.run`.

    python -m torch.distributed.run --nproc_per_node 2 tests/ddp_worker.py OUT LLAMA_DIR QWEN_DIR KIND[,KIND...]

For each KIND (one launch runs several, to pay the process start-up once), in OUT/KIND: trains with a checkpoint
per epoch (or PbRL stage) (run "full"), then a fresh trainer resumes from checkpoint-1 (run "resumed"); every
process writes its final weights and logs. KIND: grpo (MAGRPO), iac (separate critics),
iac-shared (value heads on the actors), maac, marlhf (MAGRPO backend).
"""

import json
import os
import sys

import torch
from datasets import Dataset
from transformers import AutoTokenizer

from comlrl_hf import IACConfig, IACTrainer, MAACConfig, MAACTrainer, MAGRPOConfig, MAGRPOTrainer
from comlrl_hf.rewards import length_ratio_reward
from comlrl_hf.trainers import distributed
from comlrl_hf.trainers.preference import MARLHFConfig, MARLHFTrainer

PROMPTS = [
    "Describe a city in the clouds:", "Invent a new holiday and explain it:", "Write a bedtime story for a dragon:",
    "Design a playground on Mars:", "Name three colours of the sea:", "Plan a picnic for robots:",
    "Explain rain to a fish:", "Sing about a lost sock:",
]
# kind -> (prompts, prompts per optimizer step over all processes, epochs)
SIZES = {"grpo": (8, 4, 2), "iac": (4, 2, 2), "iac-shared": (4, 2, 2), "maac": (4, 2, 2),
         "marlhf": (4, 2, 1)}


class PromptLog:
    """A stateful reward (length_ratio_reward) that remembers the prompts it scored: a process's shard, so its
    state differs between processes and each process's must come back on resume."""

    def __init__(self):
        self.prompts = []

    def __call__(self, completions1, completions2, prompts=None):
        self.prompts += list(prompts)
        return length_ratio_reward(completions1, completions2)

    def state_dict(self):
        return {"prompts": list(self.prompts)}

    def load_state_dict(self, state):
        self.prompts = list(state["prompts"])


def build(kind, dirs, world_size):
    prompts, global_batch, epochs = SIZES[kind]
    common = dict(output_dir="out", num_train_epochs=epochs, max_new_tokens=8, logging_steps=1, report_to=[],
                  disable_tqdm=True, agent_learning_rate=1e-3, per_device_train_batch_size=global_batch // world_size,
                  seed_generation_per_prompt=True)
    data = dict(reward_func=length_ratio_reward, train_dataset=Dataset.from_dict({"prompt": PROMPTS[:prompts]}))
    if kind == "grpo":
        data["reward_func"] = PromptLog()
        return MAGRPOTrainer(agents=list(dirs), args=MAGRPOConfig(num_generations=4, **common), **data)
    if kind == "marlhf":
        args = MARLHFConfig(num_generations=2, preference_num_candidates=4, preference_pairs_per_sample=2,
                            reward_model_name=str(dirs[1]), reward_model_device=None, reward_learning_rate=1e-3,
                            reward_train_batch_size=2, reward_eval_fraction=0.0, **common)
        return MARLHFTrainer(agents=list(dirs), args=args, **data)
    tokenizers = [AutoTokenizer.from_pretrained(d) for d in dirs]
    if kind == "maac":  # a centralized Q critic: its value loss is a shared loss, once per step
        return MAACTrainer(agents=list(dirs), tokenizer=tokenizers, critic_model=dirs[1],
                           args=MAACConfig(num_generations=2, critic_type="q", **common), **data)
    separate = kind == "iac"
    return IACTrainer(agents=list(dirs), tokenizer=tokenizers, critics=list(dirs) if separate else None,
                      args=IACConfig(num_generations=2, use_separate_critic=separate, **common), **data)


def snapshot(trainer) -> dict:
    """Agents, critics and value heads (the container), and a MARLHF reward model."""
    out = {k: v.detach().clone() for k, v in trainer._container.state_dict().items()}
    if getattr(trainer, "reward_model", None) is not None:
        out.update({f"reward_model.{k}": v.detach().clone() for k, v in trainer.reward_model.state_dict().items()})
    return out


def step_logs(trainer) -> list:
    return [{k: v for k, v in log.items() if k not in ("train_runtime",)} for log in trainer.state.log_history if "loss" in log]


def run(kind, dirs, world, rank):
    full = build(kind, dirs, world)
    assert full.args.world_size == world, (full.args.world_size, world)
    full.train(checkpoint_dir="full", checkpoint_interval=1)
    checkpoints = sorted(os.listdir("full"))
    resumed = build(kind, dirs, world)
    resumed.train(resume_from_checkpoint="full/checkpoint-1", checkpoint_dir="full", checkpoint_interval=1)
    torch.save({"full": snapshot(full), "resumed": snapshot(resumed),
                "full_optimizer": full.optimizer.state_dict(), "resumed_optimizer": resumed.optimizer.state_dict()},
               f"weights_rank{rank}.pt")
    with open(f"logs_rank{rank}.json", "w") as f:
        json.dump({"full": step_logs(full), "resumed": step_logs(resumed), "env_step": [full.env_step, resumed.env_step],
                   "files": sorted(os.listdir("full/checkpoint-1")), "checkpoints": checkpoints,
                   "pairs": getattr(full, "_stage", {}).get("pairs"),
                   "reward_state": [t.reward_caller.reward_func.state_dict() if kind == "grpo" else None
                                    for t in (full, resumed)]}, f)


def check_broadcast(out, dirs, world, rank):
    """Agents handed over as objects that differ between processes (process 1's is shifted) leave construction
    as process 0's: every process writes its agents' parameter sums."""
    from transformers import AutoModelForCausalLM

    agents = [AutoModelForCausalLM.from_pretrained(d) for d in dirs]
    if rank == 1:
        with torch.no_grad():
            next(agents[0].parameters()).add_(0.5)
    args = MAGRPOConfig(output_dir="out", report_to=[], per_device_train_batch_size=1, num_generations=2)
    trainer = MAGRPOTrainer(agents=agents, tokenizer=[AutoTokenizer.from_pretrained(d) for d in dirs], args=args,
                            reward_func=length_ratio_reward, train_dataset=Dataset.from_dict({"prompt": PROMPTS}))
    sums = [p.double().sum().item() for a in trainer.agents for p in a.parameters()]
    with open(os.path.join(out, f"broadcast_rank{rank}.json"), "w") as f:
        json.dump(sums, f)


def main(out, llama_dir, qwen_dir, kinds):
    torch.set_num_threads(1)
    distributed._BUCKET_BYTES = 64 * 1024  # tiny agents (~400 KB) then span several gradient/broadcast buckets
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    os.makedirs(out, exist_ok=True)
    check_broadcast(out, [llama_dir, qwen_dir], world, rank)
    for kind in kinds.split(","):
        folder = os.path.join(out, kind)
        os.makedirs(folder, exist_ok=True)
        os.chdir(folder)
        run(kind, [llama_dir, qwen_dir], world, rank)


if __name__ == "__main__":
    main(*sys.argv[1:5])
