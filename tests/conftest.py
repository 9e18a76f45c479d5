import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402

from comlrl_hf.rewards import length_ratio_reward, space_share_reward  # noqa: E402,F401
from comlrl_hf.testing import save_tiny_model  # noqa: E402

torch.set_num_threads(1)

PROMPTS = [
    "Describe a city in the clouds:",
    "Invent a new holiday and explain it:",
    "Write a bedtime story for a dragon:",
    "Design a playground on Mars:",
]


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory):
    """Llama-shaped tiny model with the Unigram tokenizer."""
    return save_tiny_model(tmp_path_factory.mktemp("models") / "llama", "llama")


@pytest.fixture(scope="session")
def qwen_dir(tmp_path_factory):
    """Qwen2-shaped tiny model with the byte-level BPE tokenizer."""
    return save_tiny_model(tmp_path_factory.mktemp("models") / "qwen2", "qwen2")


@pytest.fixture()
def dataset():
    return Dataset.from_dict({"prompt": PROMPTS})


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    # Trainers default output_dir to a relative path; keep every test's files in its own folder.
    monkeypatch.chdir(tmp_path)


# ---- the reliability summary line (docs/reliability.md) ----
_RELIABILITY_FILES = ("test_bad_inputs.py", "test_properties.py", "test_security.py", "test_fault_injection.py")


def pytest_terminal_summary(terminalreporter):
    """One line counting what the reliability tests of this session really ran (nothing when none ran)."""
    counts = {name: [0, 0] for name in _RELIABILITY_FILES}  # [ran, passed]
    disk_full = [0, 0]  # the full-disk tests of test_fault_injection.py (a skipped one did not run)
    trials = survived = 0
    for outcome in ("passed", "failed", "error"):
        for report in terminalreporter.stats.get(outcome, []):
            if getattr(report, "when", None) != "call" and outcome == "passed":
                continue
            file = report.nodeid.split("::")[0].rsplit("/", 1)[-1]
            if file not in counts or (file == "test_bad_inputs.py" and "test_bad_input_is_refused" not in report.nodeid):
                continue
            counts[file][0] += 1
            counts[file][1] += outcome == "passed"
            if file == "test_fault_injection.py" and ("disk_full" in report.nodeid or "full_tmpfs" in report.nodeid):
                disk_full[0] += 1
                disk_full[1] += outcome == "passed"
            properties = dict(getattr(report, "user_properties", []))
            trials += properties.get("fault_trials", 0)
            survived += properties.get("faults_survived", 0)
    if not any(ran for ran, _ in counts.values()):
        return
    inputs, props, security = counts["test_bad_inputs.py"], counts["test_properties.py"], counts["test_security.py"]
    lost = "n/a (no fault trial ran)" if not trials else (
        "nothing lost" if survived == trials and inputs[0] == inputs[1] and disk_full[0] == disk_full[1] else "SOMETHING LOST")
    terminalreporter.write_line(
        f"reliability: {trials} fault trials run, {survived} survived with identical weights after resume; "
        f"{disk_full[1]}/{disk_full[0]} full-disk checkpoint writes gave a clear error and kept the previous checkpoint; "
        f"{inputs[0]} bad inputs tried, {inputs[1]} refused early with no file outside the output folder; "
        f"{props[1]}/{props[0]} property tests hold; {security[1]}/{security[0]} security checks pass; {lost}"
    )
