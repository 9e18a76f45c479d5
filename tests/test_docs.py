"""Every code block of docs/*.md and README.md runs.

- ```python blocks run in order, one namespace per page (a block may use names an earlier block on the same page
  defined), in a fresh working directory per page.
- Hub ids ("Qwen/...", "HuggingFaceTB/...", "meta-llama/...") are replaced by tiny local models: every Qwen id by
  a Qwen2-shaped model with the byte-level BPE tokenizer (Qwen models share a vocabulary), every other id by a
  Llama-shaped model with the Unigram tokenizer; each distinct id gets its own weights. `max_new_tokens=N` is
  capped at 8. Nothing else is changed.
- ```bash / ```console blocks: each line starting with `comlrl-hf` runs through `comlrl_hf.cli.main` with the
  same substitutions, the recipe's hub id replaced by `--agent_model <tiny Llama>` when the line names none, and
  `--max_new_tokens 8 --num_train_epochs 1 --disable_tqdm true` appended. Other shell lines (pip, make) are not run.
- A block opened with ```python skip-test is not run (none is, today: the test below counts them).
- docs/api.md must equal what docs/gen_api.py generates from the docstrings.
"""

import importlib.util
import os
import re
import shlex
import zlib
from pathlib import Path

import pytest

from comlrl_hf.testing import save_tiny_model

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
FENCE = re.compile(r"^```([\w-]*)([^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
HUB_ID = re.compile(r"""(["'])((?:Qwen|HuggingFaceTB|meta-llama)/[\w.-]+)\1""")


def blocks(page: Path) -> list[tuple[str, str, str]]:
    return [(m.group(1), m.group(2).strip(), m.group(3)) for m in FENCE.finditer(page.read_text(encoding="utf-8"))]


class TinyHub:
    """Hub id -> a tiny local model folder (built once per id)."""

    def __init__(self, root: Path):
        self.root, self.paths = root, {}

    def __call__(self, hub_id: str) -> str:
        if hub_id not in self.paths:
            arch = "qwen2" if hub_id.startswith("Qwen/") else "llama"
            self.paths[hub_id] = save_tiny_model(self.root / hub_id.replace("/", "--"), arch, seed=zlib.crc32(hub_id.encode()) % 1000)
        return self.paths[hub_id]

    def substitute(self, code: str) -> str:
        code = HUB_ID.sub(lambda m: repr(self(m.group(2))), code)
        return re.sub(r"max_new_tokens=(\d+)", lambda m: f"max_new_tokens={min(int(m.group(1)), 8)}", code)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    return TinyHub(tmp_path_factory.mktemp("hub"))


def _run_shell_line(line: str, hub: TinyHub, workdir: Path) -> None:
    from comlrl_hf import cli

    workdir.mkdir()
    os.chdir(workdir)  # each command as if run on its own (the page's monkeypatch restores the directory)

    argv = shlex.split(HUB_ID.sub(lambda m: shlex.quote(hub(m.group(2))), line))[1:]
    argv = [str(REPO / a) if a.startswith("examples/") else a for a in argv]
    if "--agent_model" not in argv and "--agents" not in argv:
        argv += ["--agent_model", hub("HuggingFaceTB/SmolLM2-135M-Instruct")]
    argv += ["--max_new_tokens", "8", "--num_train_epochs", "1", "--disable_tqdm", "true"]
    assert cli.main(argv) == 0, line


@pytest.fixture(autouse=True)
def _close_wandb_runs():
    """A page that trains with W&B leaves its (offline) run open, as a user script would; close it so the next
    test starts without one."""
    yield
    import wandb

    if wandb.run is not None:
        wandb.run.finish()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_block_of_the_page_runs(page, hub, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"docs_{page.stem}"}
    for number, (language, info, code) in enumerate(blocks(page), 1):
        if language == "python" and "skip-test" not in info:
            try:
                exec(compile(hub.substitute(code), f"{page.name}#block{number}", "exec"), namespace)
            except Exception as error:
                raise AssertionError(f"{page.name} block {number} failed:\n{code}") from error
        elif language in ("bash", "console"):
            for line_number, line in enumerate(code.splitlines()):
                if line.strip().startswith("comlrl-hf "):
                    _run_shell_line(line.split("#", 1)[0].strip(), hub, tmp_path / f"sh{number}-{line_number}")
        

def test_no_block_is_skipped():
    skipped = [(p.name, info) for p in PAGES for lang, info, _ in blocks(p) if "skip-test" in info]
    assert skipped == []


def test_api_reference_is_generated_from_the_docstrings():
    spec = importlib.util.spec_from_file_location("gen_api", REPO / "docs" / "gen_api.py")
    gen_api = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_api)
    generated = gen_api.render()
    assert generated == (REPO / "docs" / "api.md").read_text(encoding="utf-8"), "run: python docs/gen_api.py"
