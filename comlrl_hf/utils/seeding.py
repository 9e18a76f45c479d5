"""A private, seeded random stream that leaves the caller's generators exactly as they were."""

from __future__ import annotations

import contextlib
import random

import numpy as np
import torch


@contextlib.contextmanager
def seeded_stream(seed: int):
    """Inside: torch (CPU and every CUDA device), Python's and NumPy's generators seeded from `seed`.
    Afterwards: all of them restored. Used wherever work must not depend on, or disturb, the training stream
    (LoRA and reward-head initialisation, preference stages, per-prompt seeded generation)."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            random.seed(seed)
            np.random.seed(seed % 2**32)
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
