"""Run untrusted generated Python in a child process with limits, and count the tests it passes.

Each run gets a fresh temporary folder as its working directory, `python -I -B` (isolated: no user site,
no PYTHON* variables, no current folder on `sys.path`), a minimal environment, and POSIX resource limits set
by the child on itself before any untrusted code runs: address space (`RLIMIT_AS`, so a memory bomb gets `MemoryError`), CPU seconds
(`RLIMIT_CPU`, SIGXCPU then SIGKILL), file size (`RLIMIT_FSIZE`) and no core files. A wall-clock timeout kills
the child's whole process group. This contains accidents (infinite loops, memory bombs, runaway output); it
is not a security boundary against deliberately hostile code (no network or filesystem isolation). POSIX only.

    >>> result = run_tests("def f(x):\\n    return x + 1\\n", ["assert f(1) == 2", "assert f(2) == 4"])
    >>> result.passed, result.total, result.status
    (1, 2, 'ok')
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

__all__ = ["SandboxResult", "run_tests"]

# The limits are set by the child on itself, first thing, before any untrusted code runs (a `preexec_fn` would
# do the same between fork and exec, but is unsafe in a parent with threads, as a training process has).
_HARNESS = r'''
import resource, sys
memory, cpu, output = (int(v) for v in sys.argv[1:4])
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_FSIZE, (output, output))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
import json
with open("payload.json", encoding="utf-8") as f:
    payload = json.load(f)
import os
os.remove("payload.json")
marker = payload.pop("marker")
namespace = {"__name__": "__main__"}
try:
    exec(compile(payload["program"], "solution.py", "exec"), namespace)
except BaseException as error:
    print(marker, "LOAD_ERROR", type(error).__name__, flush=True)
    raise SystemExit(0)
print(marker, "LOADED", flush=True)
for index, test in enumerate(payload["tests"]):
    try:
        exec(compile(test, f"test_{index}", "exec"), namespace)
    except BaseException as error:
        print(marker, "FAIL", index, type(error).__name__, flush=True)
    else:
        print(marker, "PASS", index, flush=True)
'''


@dataclass
class SandboxResult:
    passed: int
    total: int
    status: str  # "ok", "timeout" (wall or CPU limit), "memory", "load_error", "crashed"
    seconds: float
    returncode: int | None
    output: str  # the child's stderr, truncated

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


def run_tests(program: str, tests: list[str], *, timeout_s: float = 5.0, memory_mb: int = 256,
              cpu_s: int | None = None, max_output_bytes: int = 1 << 20) -> SandboxResult:
    """Execute `program`, then each test snippet (in the program's namespace), in a limited child process.

    `passed` counts tests that ran without raising; tests not reached before a kill count as failed.
    `timeout_s` bounds wall time, `cpu_s` (default: `ceil(timeout_s)`) CPU time, `memory_mb` the address space.
    """
    if timeout_s <= 0 or memory_mb <= 0:
        raise ValueError(f"timeout_s and memory_mb must be > 0, got {timeout_s} and {memory_mb}")
    cpu_s = cpu_s if cpu_s is not None else max(1, int(-(-timeout_s // 1)))
    marker = secrets.token_hex(8)
    workdir = tempfile.mkdtemp(prefix="comlrl_hf_sandbox-")
    started = time.monotonic()
    try:
        with open(os.path.join(workdir, "payload.json"), "w", encoding="utf-8") as f:
            json.dump({"program": program, "tests": list(tests), "marker": marker}, f)
        with open(os.path.join(workdir, "harness.py"), "w", encoding="utf-8") as f:
            f.write(_HARNESS)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
               "PYTHONHASHSEED": "0", "HOME": workdir, "TMPDIR": workdir}
        with open(os.path.join(workdir, "stdout"), "wb") as out, open(os.path.join(workdir, "stderr"), "wb") as err:
            child = subprocess.Popen(
                [sys.executable, "-I", "-B", "harness.py", str(memory_mb * 1024 * 1024), str(cpu_s), str(max_output_bytes)],
                cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
            )
            timed_out = False
            try:
                child.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                try:  # the whole group: anything the program spawned goes too
                    os.killpg(child.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                child.wait()
        seconds = time.monotonic() - started
        stdout = _read(os.path.join(workdir, "stdout"), max_output_bytes)
        stderr = _read(os.path.join(workdir, "stderr"), 4000)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    lines = [line.split()[1:] for line in stdout.splitlines() if line.startswith(marker + " ")]
    passed = sum(1 for fields in lines if fields and fields[0] == "PASS")
    failures = [fields[2] for fields in lines if len(fields) > 2 and fields[0] == "FAIL"]
    load_error = next((fields[1] for fields in lines if fields[0] == "LOAD_ERROR" and len(fields) > 1), None)
    code = child.returncode
    if timed_out or code in (-signal.SIGXCPU, -signal.SIGKILL) and "MemoryError" not in stderr:
        status = "timeout"
    elif "MemoryError" in stderr or load_error == "MemoryError" or "MemoryError" in failures:
        status = "memory"
    elif load_error is not None:
        status = "load_error"
    elif code != 0:
        status = "crashed"
    else:
        status = "ok"
    return SandboxResult(passed, len(tests), status, seconds, code, stderr)


def _read(path: str, limit: int) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")
