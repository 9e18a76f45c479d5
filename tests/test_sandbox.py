"""The reward sandbox of the coding example: tests are counted, and runaway programs die within their limits."""

import time

import pytest

from comlrl_hf.sandbox import run_tests

pytestmark = pytest.mark.skipif(not hasattr(__import__("os"), "killpg"), reason="POSIX only")

GOOD = "def add(a, b):\n    return a + b\n"


def test_counts_passed_tests():
    result = run_tests(GOOD, ["assert add(1, 2) == 3", "assert add(1, 1) == 3", "assert add(-1, 1) == 0"])
    assert (result.passed, result.total, result.status) == (2, 3, "ok")
    assert result.fraction == pytest.approx(2 / 3)


def test_a_program_that_does_not_load_passes_nothing():
    result = run_tests("def add(a, b) return a", ["assert add(1, 2) == 3"])
    assert (result.passed, result.status) == (0, "load_error")


def test_infinite_loop_is_killed_within_the_wall_limit():
    started = time.monotonic()
    result = run_tests(GOOD, ["assert add(1, 2) == 3", "while True:\n    pass", "assert add(2, 2) == 4"],
                       timeout_s=1.5)
    elapsed = time.monotonic() - started
    assert result.status == "timeout" and result.passed == 1  # the test after the loop is never reached
    assert elapsed < 1.5 + 2.0, elapsed


def test_sleeping_forever_is_killed_by_the_wall_clock_not_the_cpu_limit():
    started = time.monotonic()
    result = run_tests("import time\ntime.sleep(60)\n", ["assert True"], timeout_s=1.0, cpu_s=30)
    assert result.status == "timeout" and result.passed == 0
    assert time.monotonic() - started < 3.0


def test_cpu_limit_kills_a_busy_loop_before_a_long_wall_limit():
    started = time.monotonic()
    result = run_tests("while True:\n    pass\n", [], timeout_s=30, cpu_s=1)
    assert result.status == "timeout" and result.returncode is not None and result.returncode < 0
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("where", ["program", "test"])
def test_memory_bomb_hits_the_address_space_limit(where):
    bomb = "blocks = []\nwhile True:\n    blocks.append(bytearray(16 * 1024 * 1024))\n"
    program, tests = (GOOD + bomb, ["assert add(1, 2) == 3"]) if where == "program" else (GOOD, [bomb, "assert add(1, 2) == 3"])
    started = time.monotonic()
    result = run_tests(program, tests, timeout_s=10, memory_mb=200)
    assert result.status == "memory", result
    assert time.monotonic() - started < 5.0  # stopped by the memory limit, not the 10 s wall clock
    assert result.passed == (0 if where == "program" else 1)  # after a failed test, the next one still runs


def test_runs_isolated_in_a_fresh_folder(monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "do-not-leak")
    probe = "import os, sys\nHERE = os.getcwd()\nISOLATED = sys.flags.isolated\n"
    result = run_tests(probe, ["assert ISOLATED == 1", "assert 'comlrl_hf_sandbox-' in HERE",
                               "assert 'SECRET_TOKEN' not in os.environ", "assert not os.path.exists('payload.json')",
                               "assert False"])
    assert (result.passed, result.total) == (4, 5)
