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
