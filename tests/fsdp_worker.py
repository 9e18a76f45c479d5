"""One process of the FSDP2 test (tests/test_fsdp.py), launched with `torch.distributed.run` and
ACCELERATE_USE_FSDP=true (what `accelerate launch --config_file examples/accelerate/fsdp2.yaml` sets).

    python -m torch.distributed.run --nproc_per_node 2 tests/fsdp_worker.py OUT LLAMA_DIR QWEN_DIR

As tests/ddp_worker.py: MAGRPO for two epochs with a checkpoint per epoch (run "full"), then a fresh trainer
resumes from checkpoint-1 (run "resumed"). Process 0 writes the gathered weights and optimizer states."""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_worker  # noqa: E402


def main(out, llama_dir, qwen_dir):
    torch.set_num_threads(1)
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    os.makedirs(out, exist_ok=True)
    os.chdir(out)
    dirs = [llama_dir, qwen_dir]
    full = ddp_worker.build("grpo", dirs, world)
    # each process holds a shard of every agent parameter (DTensor), not a replica
    local = sum(p.to_local().numel() for a in full.agents for p in a.parameters())
    total = sum(p.numel() for a in full.agents for p in a.parameters())
    full.train(checkpoint_dir="full", checkpoint_interval=1)
    full._generate_for(0, ["Describe a city in the clouds:"], 1, do_sample=False)  # gathers agent 0 whole, then
    resharded = all(type(p).__name__ == "DTensor" for p in full.agents[0].parameters())  # every group is sharded again
    full_state = full._gather_full_state()
    resumed = ddp_worker.build("grpo", dirs, world)
    resumed.train(resume_from_checkpoint="full/checkpoint-1", checkpoint_dir="resumed", checkpoint_interval=1)
    resumed_state = resumed._gather_full_state()
    if rank == 0:
        torch.save({"full": full_state, "resumed": resumed_state}, "states.pt")
    with open(f"logs_rank{rank}.json", "w") as f:
        json.dump({"full": ddp_worker.step_logs(full), "resumed": ddp_worker.step_logs(resumed),
                   "env_step": [full.env_step, resumed.env_step], "local": local, "total": total, "resharded": resharded,
                   "files": sorted(os.listdir("full/checkpoint-1"))}, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
