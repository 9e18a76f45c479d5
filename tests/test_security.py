"""Security rules (docs/reliability.md): only safetensors or `torch.load(weights_only=True)` loads, no pickle,
no hard-coded `trust_remote_code=True`, and `trust_remote_code` reaches `from_pretrained` only when the user
puts it in `model_config["model_kwargs"]`.

The source checks parse every Python file with `ast` (a comment or a string mentioning `torch.load` is not a
call; a call split over lines is still one call)."""

import ast
from pathlib import Path

import pytest

import comlrl_hf

ROOT = Path(comlrl_hf.__file__).resolve().parent.parent
SCANNED = ("comlrl_hf", "examples", "benchmarks")
# Modules whose loaders execute arbitrary code from the file they read.
PICKLE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "marshal", "shelve"}


def _python_files():
    files = [p for d in SCANNED for p in sorted((ROOT / d).rglob("*.py"))]
    assert len(files) > 20, f"scanned too few files under {ROOT}: {files}"  # the scan must really see the package
    return files


def _dotted(node) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node, _dotted(node.func)


def _keyword(call: ast.Call, name: str):
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def _is_true(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def unsafe_loads(source: str, filename: str) -> list[str]:
    """Every load in `source` that can unpickle arbitrary objects, as 'file:line: what'."""
    tree = ast.parse(source, filename)
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PICKLE_MODULES:
                    problems.append(f"{filename}:{node.lineno}: imports {alias.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PICKLE_MODULES:
            problems.append(f"{filename}:{node.lineno}: imports from {node.module}")
        elif isinstance(node, ast.ImportFrom) and node.module == "torch" and any(a.name == "load" for a in node.names):
            problems.append(f"{filename}:{node.lineno}: imports torch.load under another name")
    for call, name in _calls(tree):
        if name == "torch.load":
            if not _is_true(_keyword(call, "weights_only")):
                problems.append(f"{filename}:{call.lineno}: {name}(...) without weights_only=True")
        elif name.endswith((".load", ".loads")) and name.split(".")[0] in PICKLE_MODULES:
            problems.append(f"{filename}:{call.lineno}: {name}(...)")
        elif name in ("numpy.load", "np.load") and _is_true(_keyword(call, "allow_pickle")):
            problems.append(f"{filename}:{call.lineno}: {name}(allow_pickle=True)")
    return problems


def hard_coded_remote_code(source: str, filename: str) -> list[str]:
    tree = ast.parse(source, filename)
    problems = [f"{filename}:{call.lineno}: {name}(trust_remote_code=...)" for call, name in _calls(tree)
                if _keyword(call, "trust_remote_code") is not None and not _is_false(_keyword(call, "trust_remote_code"))]
    for node in ast.walk(tree):  # {"trust_remote_code": True} spliced in with **kwargs
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "trust_remote_code" and not _is_false(value):
                    problems.append(f"{filename}:{node.lineno}: dict sets trust_remote_code")
    return problems


def _is_false(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def test_the_checkers_catch_what_they_claim_to():
    bad = (
        "import torch, pickle\n"
        "a = torch.load(p)\n"
        "b = torch.load(p, weights_only=False)\n"
        "c = torch.load(\n    p,\n    map_location='cpu')\n"
        "d = pickle.loads(x)\n"
        "from joblib import load\n"
        "e = np.load(p, allow_pickle=True)\n"
        "from torch import load\n"
    )
    found = unsafe_loads(bad, "bad.py")
    assert sorted(int(line.split(":")[1]) for line in found) == [1, 2, 3, 4, 7, 8, 9, 10], found
    good = "import torch\nx = torch.load(p, map_location='cpu', weights_only=True)\n# torch.load(p)\ns = 'torch.load(p)'\n"
    assert unsafe_loads(good, "good.py") == []
    remote = "m = A.from_pretrained(p, trust_remote_code=True)\nk = {'trust_remote_code': True}\nok = f(trust_remote_code=False)\n"
    assert len(hard_coded_remote_code(remote, "r.py")) == 2


def test_every_load_is_safetensors_or_weights_only():
    problems, loads = [], 0
    for path in _python_files():
        source = path.read_text(encoding="utf-8")
        problems += unsafe_loads(source, str(path.relative_to(ROOT)))
        loads += sum(1 for _, name in _calls(ast.parse(source)) if name == "torch.load")
    assert problems == []
    assert loads >= 3  # the checkpoint and value-head loads are really there and were checked


def test_no_hard_coded_trust_remote_code():
    problems = []
    for path in _python_files():
        problems += hard_coded_remote_code(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert problems == []


@pytest.fixture()
def recorded_loads(monkeypatch):
    """Every `from_pretrained` call of the package's Auto classes, with its keyword arguments."""
    import transformers

    calls = []
    for cls_name in ("AutoModelForCausalLM", "AutoTokenizer", "AutoModelForSequenceClassification"):
        cls = getattr(transformers, cls_name)
        original = cls.from_pretrained.__func__

        def spy(klass, *args, _original=original, _name=cls_name, **kwargs):
            calls.append((_name, kwargs))
            return _original(klass, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    return calls


def test_trust_remote_code_is_off_unless_the_user_asks(recorded_loads, llama_dir, qwen_dir, dataset):
    from comlrl_hf import MAGRPOConfig, MAGRPOTrainer
    from comlrl_hf.models.reward_model import load_reward_model
    from comlrl_hf.rewards import length_ratio_reward

    MAGRPOTrainer(agents=[llama_dir, qwen_dir], reward_func=length_ratio_reward, train_dataset=dataset,
                  args=MAGRPOConfig(output_dir="out", report_to=[]))
    load_reward_model(qwen_dir, None, device=__import__("torch").device("cpu"), seed=0)
    kinds = {name for name, _ in recorded_loads}
    assert kinds == {"AutoModelForCausalLM", "AutoTokenizer", "AutoModelForSequenceClassification"}
    assert all(not kwargs.get("trust_remote_code") for _, kwargs in recorded_loads), recorded_loads

    recorded_loads.clear()
    MAGRPOTrainer(agents=[llama_dir, qwen_dir], reward_func=length_ratio_reward, train_dataset=dataset,
                  model_config={"model_kwargs": {"trust_remote_code": True}},
                  args=MAGRPOConfig(output_dir="out", report_to=[]))
    models = [kwargs for name, kwargs in recorded_loads if name == "AutoModelForCausalLM"]
    assert len(models) == 2 and all(kwargs.get("trust_remote_code") is True for kwargs in models)
