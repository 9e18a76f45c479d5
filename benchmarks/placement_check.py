"""Model placement on a real GPU (part of benchmarks/gpu_check.sh): agent 0 on cuda:0, agent 1 on the CPU.

    python benchmarks/placement_check.py          # needs one CUDA device
    python benchmarks/placement_check.py --cpu    # dry run of the same code with both agents on the CPU

For MAGRPO and IAC (separate critics, which follow their agents) on tiny random models: a 2-epoch run with a
checkpoint per epoch; every agent's (and critic's) parameters must still be on its device and every logged loss
finite; then a 1-epoch run resumed from its checkpoint-1 to 2 epochs must give bitwise the weights of the
uninterrupted run (CUBLAS_WORKSPACE_CONFIG is set for deterministic cuBLAS). With CUDA, the checkpoint must hold
every CUDA device's RNG (rng_state_cuda_all.pth). Prints one PASS/FAIL line per check and exits 1 on any FAIL.
"""

import argparse
import math
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, so resume can be bitwise

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from comlrl_hf import IACConfig, IACTrainer, MAGRPOConfig, MAGRPOTrainer  # noqa: E402
from comlrl_hf.rewards import length_ratio_reward  # noqa: E402
from comlrl_hf.testing import save_tiny_model  # noqa: E402
from comlrl_hf.trainers.placement import CUDA_RNG_ALL_NAME  # noqa: E402

PROMPTS = ["Describe a city in the clouds:", "Invent a new holiday:", "Write a story for a dragon:", "Design a park on Mars:"]
FAILED: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f"  ({detail})" if detail else ""), flush=True)
    if not ok:
        FAILED.append(name)


def build(kind: str, dirs: list[str], devices: list[str], epochs: int):
    common = dict(output_dir="out", num_train_epochs=epochs, max_new_tokens=8, num_generations=2, report_to=[],
                  logging_steps=1, disable_tqdm=True, agent_learning_rate=1e-3, agent_devices=devices)
    dataset = Dataset.from_dict({"prompt": PROMPTS})
    if kind == "MAGRPO":
        return MAGRPOTrainer(agents=dirs, reward_func=length_ratio_reward, train_dataset=dataset,
                             args=MAGRPOConfig(**common))
    return IACTrainer(agents=dirs, tokenizer=[AutoTokenizer.from_pretrained(d) for d in dirs], critics=dirs,
                      reward_func=length_ratio_reward, train_dataset=dataset, args=IACConfig(**common))


def weights(trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in trainer.model.state_dict().items()}


def run(kind: str, dirs: list[str], devices: list[str], root: str) -> None:
    os.chdir(tempfile.mkdtemp(prefix=f"{kind}-", dir=root))
    full = build(kind, dirs, devices, epochs=2)
    full.train(checkpoint_dir="full", checkpoint_interval=1)
    wanted = [torch.device(d) for d in devices]
    placed = [{p.device for p in agent.parameters()} == {wanted[i]} for i, agent in enumerate(full.agents)]
    critics = list(getattr(full, "critics", None) or [])  # IAC critic i follows agent i
    placed += [{p.device for p in critic.parameters()} == {wanted[i]} for i, critic in enumerate(critics)]
    check(f"{kind}: each agent/critic stayed on its device {devices}", all(placed),
          "; ".join(f"{i}: {sorted(map(str, {p.device for p in m.parameters()}))}"
                    for i, m in enumerate(list(full.agents) + critics)))
    losses = [log["loss"] for log in full.state.log_history if "loss" in log]
    check(f"{kind}: {len(losses)} logged losses, all finite", bool(losses) and all(math.isfinite(x) for x in losses),
          f"losses {[round(x, 5) for x in losses]}")
    if torch.cuda.is_available():
        check(f"{kind}: checkpoint holds every CUDA device's RNG",
              os.path.isfile(os.path.join("full", "checkpoint-1", CUDA_RNG_ALL_NAME)))
    first = build(kind, dirs, devices, epochs=1)
    initial = weights(first)
    first.train(checkpoint_dir="ck", checkpoint_interval=1)
    resumed = build(kind, dirs, devices, epochs=2)
    resumed.train(resume_from_checkpoint="ck/checkpoint-1", checkpoint_dir="ck", checkpoint_interval=1)
    a, b = weights(full), weights(resumed)
    diff = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    moved = max((a[k].float() - initial[k].float()).abs().max().item() for k in a)
    check(f"{kind}: resume from checkpoint-1 equals the uninterrupted run bitwise",
          all(torch.equal(a[k], b[k]) for k in a), f"max |diff| {diff:.3g}; training moved weights by up to {moved:.3g}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="dry run on the CPU (both agents on 'cpu')")
    args = parser.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        print("FAIL  placement check: no CUDA device (use --cpu for a dry run)")
        return 1
    devices = ["cpu", "cpu"] if args.cpu else ["cuda:0", "cpu"]
    torch.manual_seed(0)
    root = tempfile.mkdtemp(prefix="placement-")
    dirs = [save_tiny_model(os.path.join(root, "llama"), "llama"), save_tiny_model(os.path.join(root, "qwen2"), "qwen2")]
    for kind in ("MAGRPO", "IAC"):
        try:
            run(kind, dirs, devices, root)
        except Exception as error:  # one algorithm's crash is a FAIL line; the other still runs
            check(f"{kind}: ran with agent_devices={devices}", False, f"{type(error).__name__}: {error}")
    print(f"placement check: {'FAIL (' + ', '.join(FAILED) + ')' if FAILED else 'PASS'}", flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
