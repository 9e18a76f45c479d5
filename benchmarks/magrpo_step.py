"""Throughput of one fixed workload (MAGRPO, or IAC/MAAC with `--trainer`): env-steps/s, generation tokens/s and peak memory.

    python benchmarks/magrpo_step.py --model tiny       # a Qwen2 + a Llama tiny random model (heterogeneous pair)
    python benchmarks/magrpo_step.py --model smollm2    # 2 x SmolLM2-135M-Instruct (see examples/smollm2.py)
    python benchmarks/magrpo_step.py --trainer iac      # or maac: the actor-critic trainers on the same workload

The workload is fixed: 2 agents, `--prompts` prompts per step, K = `--num-generations` samples per agent per
prompt, and every completion exactly `--tokens` long (min_new_tokens == max_new_tokens), for `--warmup` + `--steps`
optimizer steps; only the last `--steps` are timed. Generation is timed on its own by wrapping
`comlrl_hf.rollout.generation.generate_completions` (here only: every comlrl_hf module that imported the
function gets the timed wrapper).

Figures:
    env-steps/s   joint actions scored per second of whole optimizer steps (rollout + loss + backward + AdamW)
    gen tok/s     completion tokens generated per second of generation, all agents together
    gen share     fraction of the step time spent generating
    peak RSS      process peak resident memory (ru_maxrss); peak CUDA memory when on a GPU
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import PrinterCallback, TrainerCallback  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

import comlrl_hf.rollout.generation as generation_module  # noqa: E402
from comlrl_hf.rewards import length_ratio_reward  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from comlrl_hf.trainers.actor_critic import IACConfig, IACTrainer, MAACConfig, MAACTrainer  # noqa: E402
from comlrl_hf.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer  # noqa: E402

# name -> (config, trainer, extra constructor arguments from the agents' model paths)
TRAINERS = {
    "magrpo": (MAGRPOConfig, MAGRPOTrainer, {}),
    "iac": (IACConfig, IACTrainer, lambda paths: {"critics": list(paths)}),
    "maac": (MAACConfig, MAACTrainer, lambda paths: {"critic_model": paths[0]}),
}

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS = [
    "Describe a city in the clouds:",
    "Invent a new holiday and explain it:",
    "Write a bedtime story for a dragon:",
    "Design a playground on Mars:",
]


class Timers:
    """Generation seconds and tokens, accumulated while `active`; step boundaries come from the callback."""

    def __init__(self):
        self.active = False
        self.gen_s = 0.0
        self.gen_tokens = 0
        self.gen_calls = 0

    def wrap(self, generate):
        def timed(model, tokenizer, prompts, num_generations, generation_kwargs):
            sync()
            t0 = time.perf_counter()
            out = generate(model, tokenizer, prompts, num_generations, generation_kwargs)
            sync()
            if self.active:
                self.gen_s += time.perf_counter() - t0
                self.gen_tokens += int(out.completion_ids.numel())
                self.gen_calls += 1
            return out

        return timed


class StepClock(TrainerCallback):
    """Starts the clock (and the generation timers) once the warm-up steps are done."""

    def __init__(self, timers: Timers, warmup: int):
        self.timers, self.warmup = timers, warmup
        self.t0 = self.t1 = None
        self.env0 = self.env1 = 0
        self.trainer = None

    def on_train_begin(self, args, state, control, **kwargs):
        if self.warmup == 0:
            self.t0, self.env0, self.timers.active = time.perf_counter(), 0, True

    def on_step_end(self, args, state, control, **kwargs):
        sync()
        if state.global_step == self.warmup:
            self.t0, self.env0 = time.perf_counter(), self.trainer.env_step
            self.timers.active = True
        elif state.global_step > self.warmup:
            self.t1, self.env1 = time.perf_counter(), self.trainer.env_step


def patch_generation(timers: Timers) -> None:
    """Replace `generate_completions` in every loaded comlrl_hf module that imported it by name."""
    original = generation_module.generate_completions
    timed = timers.wrap(original)
    patched = []
    for name, module in list(sys.modules.items()):
        if name.startswith("comlrl_hf") and getattr(module, "generate_completions", None) is original:
            module.generate_completions = timed
            patched.append(name)
    if len(patched) < 2:  # the defining module and at least one caller
        raise RuntimeError(f"found no caller of generate_completions to time (patched: {patched})")


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def model_pair(name: str, workdir: str) -> tuple[list[str], str]:
    if name == "tiny":
        from comlrl_hf.testing import save_tiny_model

        return [
            save_tiny_model(os.path.join(workdir, "tiny-qwen2"), "qwen2"),
            save_tiny_model(os.path.join(workdir, "tiny-llama"), "llama"),
        ], "tiny qwen2 + tiny llama"
    if name == "smollm2":
        sys.path.insert(0, os.path.join(ROOT, "examples"))
        from smollm2 import smollm2_dir

        path = smollm2_dir()
        return [path, path], "2 x SmolLM2-135M"
    raise ValueError(f"unknown model {name!r}")


def run(args) -> str:
    torch.manual_seed(args.seed)
    timers = Timers()
    patch_generation(timers)
    with tempfile.TemporaryDirectory() as workdir:
        paths, label = model_pair(args.model, workdir)
        prompts = (PROMPTS * ((args.prompts + len(PROMPTS) - 1) // len(PROMPTS)))[: args.prompts]
        config_cls, trainer_cls, extra = TRAINERS[args.trainer]
        if args.trainer != "magrpo":
            extra = dict(extra(paths), tokenizer=[AutoTokenizer.from_pretrained(p) for p in paths])
        config = config_cls(
            output_dir=os.path.join(workdir, "out"),
            max_steps=args.warmup + args.steps,
            per_device_train_batch_size=args.prompts,
            num_generations=args.num_generations,
            max_new_tokens=args.tokens,
            min_new_tokens=args.tokens,
            temperature=1.0,
            top_p=1.0,
            agent_learning_rate=1e-6,
            logging_steps=10**6,
            save_strategy="no",
            report_to=[],
            seed=args.seed,
            disable_tqdm=True,
            shuffle_dataset=False,
        )
        clock = StepClock(timers, args.warmup)
        t_load = time.perf_counter()
        trainer = trainer_cls(
            agents=paths, reward_func=length_ratio_reward, train_dataset=Dataset.from_dict({"prompt": prompts}),
            args=config, callbacks=[clock], **(extra if isinstance(extra, dict) else {}),
        )
        load_s = time.perf_counter() - t_load
        clock.trainer = trainer
        trainer.remove_callback(PrinterCallback)
        trainer.train()

    step_s = clock.t1 - clock.t0
    env_steps = clock.env1 - clock.env0
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    cuda = ""
    if torch.cuda.is_available():
        cuda = f"  peak CUDA {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB"
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU x{torch.get_num_threads()} threads"
    return (
        f"[{args.model}/{args.trainer}] {label} | {device} | {args.prompts} prompts x K={args.num_generations} x {args.tokens} tok, "
        f"{args.steps} steps (+{args.warmup} warm-up): {env_steps / step_s:.2f} env-steps/s, "
        f"{step_s / args.steps:.2f} s/step, gen {timers.gen_tokens / timers.gen_s:.0f} tok/s "
        f"({timers.gen_s / step_s:.0%} of step), load {load_s:.1f} s, peak RSS {rss_mib:.0f} MiB{cuda}"
    )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    p.add_argument("--trainer", choices=sorted(TRAINERS), default="magrpo",
                   help="magrpo, or an actor-critic trainer (IAC: separate critics on the agents' models; MAAC: one)")
    p.add_argument("--prompts", type=int, default=2, help="prompts per optimizer step")
    p.add_argument("--num-generations", type=int, default=4, help="K")
    p.add_argument("--tokens", type=int, default=32, help="forced completion length")
    p.add_argument("--steps", type=int, default=4, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    print(run(args), flush=True)


if __name__ == "__main__":
    main()
