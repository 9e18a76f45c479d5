"""One fixed MAGRPO workload through comlrl_hf and, with `--compare-comlrl`, through the original comlrl 1.4.3.

    python benchmarks/compare_comlrl.py --model tiny --prompts 4 16
    python benchmarks/compare_comlrl.py --model smollm2 --prompts 4 --compare-comlrl --comlrl-path DIR

Workload (issue 9): the spec §6 length-ratio reward, 2 agents, K = 4 samples per agent per prompt, every
completion exactly `--tokens` long (min_new_tokens = max_new_tokens), 1 epoch over `--prompts` prompts, full
fine-tune. Each measurement runs in its own subprocess; with `--compare-comlrl` the libraries alternate
(ours, comlrl, ours, comlrl, ...) `--repeats` times to cancel machine drift, and the medians are printed.

comlrl is never a dependency of comlrl_hf: install it into a folder and pass that folder, e.g.
    pip install --no-deps -t /tmp/comlrl-site comlrl==1.4.3 openai

Figures per run:
    env-steps/s   joint actions scored per second of `train()`
    gen tok/s     completion tokens per second of `generate` (all agents; timed by wrapping each agent's generate)
    update s/step (train time - generate time) / optimizer steps (ours: one step per batch of prompts; comlrl:
                  one AdamW step per agent every 2 prompts, counted per pair of agent updates)
    peak RSS      the subprocess's peak resident memory
    floor         ours only: one batched generate per agent over all prompts x K plus one forward+backward over
                  the same tokens, in the same process, after training: the least any implementation must do
    step s        ours only: seconds inside optimizer steps (train s minus `train()`'s one-time set-up)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPTS = [
    "Describe a city in the clouds:", "Invent a new holiday and explain it:", "Write a bedtime story for a dragon:",
    "Design a playground on Mars:", "Explain how a lighthouse works:", "Plan a picnic for robots:",
    "Describe the taste of a color:", "Write a letter to the moon:",
]


# Random-initialised shapes for the GPU check (no weights needed): SmolLM2-135M and Qwen2.5-0.5B.
SHAPES = {
    "smollm2-shaped": ("llama", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                                     num_key_value_heads=3, vocab_size=49152)),
    "0.5b-shaped": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                                  num_key_value_heads=2, vocab_size=151936)),
}


def _random_model_dir(shape: str, workdir: str) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from comlrl_hf.testing import build_tokenizer

    arch, sizes = SHAPES[shape]
    tokenizer = build_tokenizer("bpe")
    config_cls, model_cls = (LlamaConfig, LlamaForCausalLM) if arch == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    config = config_cls(max_position_embeddings=1024, tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, **sizes)
    path = os.path.join(workdir, shape)
    model_cls(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _model_dirs(model: str, workdir: str) -> list[str]:
    if model in SHAPES:
        path = _random_model_dir(model, workdir)
        return [path, path]
    sys.path.insert(0, HERE)
    from magrpo_step import model_pair

    paths, _ = model_pair(model, workdir)
    return [paths[0], paths[0]] if model == "tiny" else paths  # homogeneous: the original needs one tokenizer


def _timed_generate(models, timer: dict) -> None:
    import torch

    for model in models:
        inner = model.generate

        def generate(*args, _inner=inner, **kwargs):
            start = time.perf_counter()
            out = _inner(*args, **kwargs)
            timer["seconds"] += time.perf_counter() - start
            sequences = out.sequences if hasattr(out, "sequences") else out
            prompt_len = kwargs["input_ids"].shape[1] if "input_ids" in kwargs else args[0].shape[1]
            timer["tokens"] += int(sequences[:, prompt_len:].numel())
            return out

        model.generate = generate
    torch.set_num_threads(torch.get_num_threads())


def _run_ours(args, dirs: list[str]) -> dict:
    import torch
    from datasets import Dataset

    from comlrl_hf.rewards import length_ratio_reward
    from comlrl_hf.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    torch.manual_seed(0)
    dataset = Dataset.from_dict({"prompt": (PROMPTS * 4)[: args.prompts]})
    config = MAGRPOConfig(
        output_dir=os.path.join(tempfile.mkdtemp(), "out"), num_train_epochs=1, num_generations=4,
        max_new_tokens=args.tokens, min_new_tokens=args.tokens, per_device_train_batch_size=args.batch or args.prompts,
        report_to=[], disable_tqdm=True, logging_steps=1000, save_strategy="no", bf16=args.bf16,
        loss_chunk_size=args.loss_chunk,
    )
    peft_config = None
    if args.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    trainer = MAGRPOTrainer(agents=dirs, reward_func=length_ratio_reward, train_dataset=dataset, args=config,
                            peft_config=peft_config, model_config={"dtype": "bfloat16"} if args.bf16 else None)
    timer = {"seconds": 0.0, "tokens": 0}
    shared_bases = {id(a.peft_model): a.peft_model for a in trainer.agents if hasattr(a, "peft_model")}
    # shared-base LoRA generates for every agent in one call on the base PeftModel
    _timed_generate(list(shared_bases.values()) or trainer.agents, timer)
    steps = _StepTimer()
    trainer.add_callback(steps)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    result = _figures(seconds, trainer.env_step, timer, trainer.state.global_step)
    result["floor_s"], result["steps_s"] = _floor(trainer, args), steps.seconds
    return result


class _StepTimer:
    """Seconds inside optimizer steps (rollout, loss, backward, optimizer), without `train()`'s one-time set-up
    (accelerate's `free_memory` runs `gc.collect`, the dataloader, the optimizer), which a 1-step run would
    otherwise charge to its step. Duck-typed TrainerCallback: only the two events it needs."""

    def __init__(self):
        self.seconds, self._start = 0.0, None

    def __getattr__(self, name):  # every other callback event: do nothing
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds += time.perf_counter() - self._start


def _floor(trainer, args) -> float:
    """One generate per agent over every prompt x K, then one forward+backward over those tokens."""
    import torch

    from comlrl_hf.utils.logprobs import completion_logps

    prompts = (PROMPTS * 4)[: args.prompts]
    start = time.perf_counter()
    for i, agent in enumerate(trainer.agents):
        rollout = trainer._generate_for(i, prompts, 4)  # one call per agent (the floor does not share a base)
        logps, _ = completion_logps(agent, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                                    rollout.completion_mask, temperature=trainer.args.temperature)
        (-(logps * rollout.completion_mask).sum() / rollout.completion_mask.sum()).backward()
        agent.zero_grad(set_to_none=True)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def _run_comlrl(args, dirs: list[str]) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
    from comlrl_hf.rewards import length_ratio_reward

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(dirs[0])
    agents = [AutoModelForCausalLM.from_pretrained(d) for d in dirs]
    config = MAGRPOConfig(num_turns=1, num_train_epochs=1, num_generations=4, max_new_tokens=args.tokens, logging_steps=1)
    trainer = MAGRPOTrainer(agents=agents, tokenizer=tokenizer, reward_func=length_ratio_reward, args=config,
                            wandb_config=None, train_dataset=Dataset.from_dict({"prompt": (PROMPTS * 4)[: args.prompts]}))
    timer = {"seconds": 0.0, "tokens": 0}
    _timed_generate(agents, timer)
    start = time.perf_counter()
    trainer.train(min_new_tokens=args.tokens)
    seconds = time.perf_counter() - start
    env_steps = args.prompts * 4  # one prompt per step, 4 aligned joint actions each
    return _figures(seconds, env_steps, timer, max(1, args.prompts // 2))


def _figures(seconds: float, env_steps: int, timer: dict, steps: int) -> dict:
    import torch

    gpu = {"peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20} if torch.cuda.is_available() else {}
    return {**gpu,
        "env_steps_per_s": env_steps / seconds, "seconds": seconds, "gen_tok_per_s": timer["tokens"] / max(timer["seconds"], 1e-9),
        "gen_share": timer["seconds"] / seconds, "update_s_per_step": (seconds - timer["seconds"]) / steps,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _warm_up(dirs: list[str]) -> None:
    """The same first-call costs paid before timing either library: one short generate and one
    forward+backward per model, in this process, on throwaway copies."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    for d in dict.fromkeys(dirs):
        model, tokenizer = AutoModelForCausalLM.from_pretrained(d).to(device), AutoTokenizer.from_pretrained(d)
        ids = tokenizer(["warm up"], return_tensors="pt").to(device)
        model.generate(**ids, max_new_tokens=4, do_sample=True, pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
        model(**ids, labels=ids["input_ids"]).loss.backward()
        del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)


def _child(args) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("WANDB_MODE", "disabled")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as workdir:
        dirs = _model_dirs(args.model, workdir)
        _warm_up(dirs)
        result = _run_ours(args, dirs) if args.child == "ours" else _run_comlrl(args, dirs)
    print("RESULT " + json.dumps(result))


def _spawn(library: str, args, prompts: int) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--child", library, "--model", args.model, "--tokens",
               str(args.tokens), "--prompts", str(prompts)] + (["--batch", str(args.batch)] if args.batch else [])
    command += ["--lora"] if args.lora else []
    command += ["--bf16"] if args.bf16 else []
    command += ["--loss-chunk", str(args.loss_chunk)] if args.loss_chunk else []
    env = dict(os.environ)
    if library == "comlrl":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (args.comlrl_path, env.get("PYTHONPATH")) if p)
    out = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode or not lines:
        raise RuntimeError(f"{library} run failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["tiny", "smollm2", *SHAPES], default="tiny")
    p.add_argument("--lora", action="store_true", help="ours: LoRA r=16 on q/k/v/o, agents sharing one base")
    p.add_argument("--bf16", action="store_true", help="bfloat16 weights and autocast (GPU)")
    p.add_argument("--loss-chunk", type=int, default=None, help="ours: loss_chunk_size (rows per loss forward+backward)")
    p.add_argument("--prompts", type=int, nargs="+", default=[4, 16])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--batch", type=int, default=None, help="ours: prompts per step (default: all prompts)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--compare-comlrl", action="store_true")
    p.add_argument("--comlrl-path", default=None, help="folder holding the comlrl package (pip install -t)")
    p.add_argument("--child", choices=["ours", "comlrl"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        args.prompts = args.prompts[0]
        return _child(args)
    libraries = ["ours", "comlrl"] if args.compare_comlrl else ["ours"]
    if args.lora and args.compare_comlrl:
        p.error("--lora runs comlrl_hf only (the original has no LoRA path to compare)")
    tuning = "LoRA r=16 (shared base)" if args.lora else "full fine-tune"
    tuning += f", loss_chunk_size={args.loss_chunk}" if args.loss_chunk else ""
    print(f"model {args.model}; 2 agents, K=4, {args.tokens} forced tokens, 1 epoch, {tuning}, "
          f"{'bf16' if args.bf16 else 'fp32'}; "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; median of {args.repeats}")
    print("| library | prompts | env-steps/s | gen tok/s | gen share | update s/step | peak RSS MiB | floor s / step s / train s |")
    print("|---|---|---|---|---|---|---|---|")
    for prompts in args.prompts:
        runs = {lib: [] for lib in libraries}
        for _ in range(args.repeats):
            for lib in libraries:  # alternate, so drift hits both
                runs[lib].append(_spawn(lib, args, prompts))
        med = {lib: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for lib, rs in runs.items()}
        for lib, m in med.items():
            floor = f"{m['floor_s']:.2f} / {m['steps_s']:.2f} / {m['seconds']:.2f}" if "floor_s" in m else "-"
            memory = f"{m['peak_rss_mib']:.0f}" + (f" (GPU {m['peak_gpu_mib']:.0f})" if "peak_gpu_mib" in m else "")
            print(f"| {lib} | {prompts} | {m['env_steps_per_s']:.2f} | {m['gen_tok_per_s']:.0f} | {m['gen_share']:.0%} | "
                  f"{m['update_s_per_step']:.2f} | {memory} | {floor} |")
        if "comlrl" in med:
            print(f"| ratio ours/comlrl | {prompts} | {med['ours']['env_steps_per_s'] / med['comlrl']['env_steps_per_s']:.2f}x | "
                  f"| | | {med['ours']['peak_rss_mib'] / med['comlrl']['peak_rss_mib']:.2f}x | |")


if __name__ == "__main__":
    main()
