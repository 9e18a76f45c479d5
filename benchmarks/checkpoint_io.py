"""Cost of one training checkpoint: write time, size on disk, verify+load time, peak memory.

    python benchmarks/checkpoint_io.py                 # 2 x SmolLM2-135M (see examples/smollm2.py)
    python benchmarks/checkpoint_io.py --model tiny

The write includes both agents' safetensors folders, the AdamW state, RNG, trainer state, the sha256
manifest and the fsyncs of the atomic publish; verify+load re-hashes every file and loads the weights in place.
"""

import argparse
import os
import resource
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402

from comlrl_hf import MAGRPOConfig, MAGRPOTrainer  # noqa: E402
from comlrl_hf.rewards import length_ratio_reward  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="smollm2")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = tempfile.mkdtemp(prefix="comlrl_hf_ckpt_bench-")
    if args.model == "smollm2":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
        from smollm2 import smollm2_dir

        path = smollm2_dir()
    else:
        from comlrl_hf.testing import save_tiny_model

        path = save_tiny_model(os.path.join(work, "tiny"), "qwen2")

    write_times = []
    original = MAGRPOTrainer._save_checkpoint

    def timed(self, model, trial):
        start = time.perf_counter()
        original(self, model, trial)
        write_times.append(time.perf_counter() - start)

    MAGRPOTrainer._save_checkpoint = timed

    def build():
        return MAGRPOTrainer(
            agents=[path, path], reward_func=length_ratio_reward,
            train_dataset=Dataset.from_dict({"prompt": ["Describe a city in the clouds:", "Design a playground on Mars:"]}),
            args=MAGRPOConfig(output_dir=os.path.join(work, "out"), num_train_epochs=1, max_new_tokens=8, report_to=[],
                              disable_tqdm=True),
        )

    build().train(checkpoint_dir=os.path.join(work, "ck"))
    checkpoint = os.path.join(work, "ck", "checkpoint-1")
    size = sum(os.path.getsize(os.path.join(r, f)) for r, _, files in os.walk(checkpoint) for f in files) / 2**30
    fresh = build()
    start = time.perf_counter()
    fresh._check_resumable(checkpoint)
    fresh._container.load_weights(checkpoint)
    load_s = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"[{args.model}] checkpoint write {write_times[0]:.1f} s, {size:.2f} GiB on disk, "
          f"verify+load {load_s:.1f} s, peak RSS {rss:.0f} MiB")


if __name__ == "__main__":
    main()
