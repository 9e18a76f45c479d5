"""The bad-input table of docs/reliability.md: bad inputs beyond the spec mismatches of test_construction.py
(and the config / preference / reward tables of test_fixtures_and_config.py, test_preference.py,
test_magrpo.py). Every row is one test that asserts

- the error type and a message that names the offending value (`names` must appear in it verbatim),
- that it is raised at the earliest point: the config or the constructor where nothing needs running; in
  `train()` before any optimizer step (weights unchanged, global_step 0) where the input only shows up then;
  for a checkpoint, before any state is restored,
- that nothing was written outside the run's output folder (`out/`): the test runs in an empty folder,
  and the tiny model folders it loads from are unchanged.
"""

import json
import math
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from datasets import Dataset
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from comlrl_hf import MAGRPOConfig, MAGRPOTrainer
from comlrl_hf.testing import build_tokenizer
from comlrl_hf.trainers.actor_critic import IACConfig, IACTrainer
from comlrl_hf.utils import CheckpointError

from conftest import PROMPTS, length_ratio_reward

OUT = "out"
JOINT_ACTIONS = 8  # 2 prompts per batch x num_generations=4


@dataclass
class Row:
    id: str
    bad_input: str
    error: type
    message: str  # regex that the message must match
    names: str  # the offending value, verbatim in the message
    where: str  # "config" | "constructor" | "train()" | "first rollout" | "resume"
    act: Callable  # act(ctx, prepared) must raise
    prepare: Callable | None = None  # prepare(ctx) -> object handed to act; must not raise
    check: Callable | None = field(default=None)  # check(error) for what a regex cannot say


def config(**kw):
    return MAGRPOConfig(**{"output_dir": OUT, "report_to": [], "max_new_tokens": 4, "disable_tqdm": True, **kw})


def trainer(ctx, cls=MAGRPOTrainer, **kw):
    kw = {"agents": ctx.dirs, "reward_func": length_ratio_reward, "train_dataset": ctx.dataset(), "args": config(),
          **_substitute(kw, ctx)}
    return cls(**kw)


def _substitute(kwargs, ctx):
    """Placeholders for what needs the session's model folders: "QWEN" -> its folder, "TOKENIZERS" -> one
    tokenizer per agent, loaded from the agents' folders."""
    out = {}
    for key, value in kwargs.items():
        if isinstance(value, str) and value == "QWEN":
            value = ctx.dirs[1]
        elif isinstance(value, str) and value == "TOKENIZERS":
            value = [AutoTokenizer.from_pretrained(d) for d in ctx.dirs]
        elif isinstance(value, list):
            value = [ctx.dirs[1] if isinstance(v, str) and v == "QWEN" else v for v in value]
        out[key] = value
    return out


def rollout_row(id, bad_input, message, names, **trainer_kw):
    """A bad input that only shows up when the first batch is rolled out: train() must fail at step 0."""
    return Row(id, bad_input, trainer_kw.pop("error", ValueError), message, names, "first rollout",
               prepare=lambda ctx: trainer(ctx, **trainer_kw), act=lambda ctx, t: t.train(),
               check=trainer_kw.pop("check", None))


def constructor_row(id, bad_input, message, names, error=ValueError, **trainer_kw):
    return Row(id, bad_input, error, message, names, "constructor", act=lambda ctx, _: trainer(ctx, **trainer_kw))


def config_row(id, bad_input, message, names, error=ValueError, cls=MAGRPOConfig, **config_kw):
    return Row(id, bad_input, error, message, names, "config",
               act=lambda ctx, _: cls(**{"output_dir": OUT, "report_to": [], **config_kw}))


def resume_row(id, bad_input, message, names, tamper, cls=MAGRPOTrainer, **trainer_kw):
    """A damaged or foreign checkpoint, copied into `ck/` and damaged by `tamper(path)`: resume must refuse it
    before restoring anything."""
    def prepare(ctx):
        path = shutil.copytree(ctx.checkpoint(), "ck/checkpoint-1")
        target = tamper(path)
        return trainer(ctx, cls=cls, **trainer_kw), target

    return Row(id, bad_input, CheckpointError, message, names, "resume", prepare=prepare,
               act=lambda ctx, prepared: prepared[0].train(resume_from_checkpoint=prepared[1]))


def rewards(value):
    return lambda c1, c2: value(len(c1))


def raising_reward(c1, c2):
    raise RuntimeError("grader service unreachable")


def _note(substring):
    def check(error):
        notes = getattr(error, "__notes__", [])
        assert any(substring in n for n in notes), notes
    return check


def _edit_metadata(edit):
    def tamper(path):
        file = os.path.join(path, "comlrl_state.json")
        data = json.load(open(file))
        edit(data)
        json.dump(data, open(file, "w"))
        return path
    return tamper


def _truncate(rel):
    def tamper(path):
        file = os.path.join(path, rel)
        size = os.path.getsize(file)
        with open(file, "r+b") as f:
            f.truncate(size // 2)
        return path
    return tamper


def _meta_model(ctx):
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(ctx.dirs[1]))


def _no_pad_no_eos():
    tok = build_tokenizer("bpe")
    tok.pad_token = None
    tok.eos_token = None
    return tok


def _export_folder(ctx, _):
    t = trainer(ctx)
    t.save_model("out/export")  # inside the output folder: a model export, not a checkpoint
    t.train(resume_from_checkpoint="out/export")


ROWS = [
    # ---- the reward function (called once per batch: its value is first seen at the first rollout) ----
    rollout_row("reward-inf", "reward_func returns +inf", r"returned inf for joint action 0 at step 0", "inf",
                reward_func=rewards(lambda n: [math.inf] * n)),
    rollout_row("reward-str-element", "reward_func returns strings in the list", r"returned '0.5' for joint action 0",
                "'0.5'", reward_func=rewards(lambda n: ["0.5"] * n)),
    rollout_row("reward-bool", "reward_func returns booleans", r"returned True for joint action 0", "True",
                reward_func=rewards(lambda n: [True] * n)),
    rollout_row("reward-none", "reward_func returns None (forgot `return`)",
                rf"must return a sequence of {JOINT_ACTIONS} floats .* got NoneType: None", "NoneType",
                reward_func=rewards(lambda n: None)),
    rollout_row("reward-dict", "reward_func returns a dict", r"must return a sequence .* got dict", "dict",
                reward_func=rewards(lambda n: {j: 1.0 for j in range(n)})),
    rollout_row("reward-too-long", "reward_func returns one reward too many",
                rf"returned {JOINT_ACTIONS + 1} rewards at step 0 but {JOINT_ACTIONS} joint actions", f"{JOINT_ACTIONS + 1}",
                reward_func=rewards(lambda n: [1.0] * (n + 1))),
    rollout_row("reward-nested", "reward_func returns a list of lists", r"returned \[1.0\] for joint action 0", "[1.0]",
                reward_func=rewards(lambda n: [[1.0]] * n)),
    rollout_row("reward-2d-tensor", "reward_func returns a [n, 2] tensor",
                rf"returned {2 * JOINT_ACTIONS} rewards at step 0 but {JOINT_ACTIONS}", f"{2 * JOINT_ACTIONS}",
                reward_func=rewards(lambda n: torch.ones(n, 2))),
    rollout_row("reward-raises", "reward_func raises", "grader service unreachable", "grader service unreachable",
                error=RuntimeError, reward_func=raising_reward, check=_note("raised by reward_func at step 0")),
    rollout_row("reward-processor-nan", "reward_processor returns NaN", r"reward_processor returned nan for joint action 0",
                "nan", reward_processor=lambda r: float("nan")),
    # ---- datasets ----
    constructor_row("dataset-empty", "an empty train_dataset", r"train_dataset is empty \(Dataset with 0 rows\)", "0 rows",
                    train_dataset=Dataset.from_dict({"prompt": []})),
    constructor_row("dataset-no-prompt", "train_dataset without a `prompt` column (default formatter)",
                    r"train_dataset has no 'prompt' column \(columns: \['question'\]\)", "['question']",
                    train_dataset=Dataset.from_dict({"question": PROMPTS})),
    constructor_row("eval-dataset-no-prompt", "eval_dataset without a `prompt` column",
                    r"eval_dataset has no 'prompt' column \(columns: \['text'\]\)", "['text']",
                    eval_dataset=Dataset.from_dict({"text": PROMPTS})),
    constructor_row("dataset-dict", "a DatasetDict / dict of splits as train_dataset",
                    r"train_dataset must be one dataset .* got dict", "dict",
                    train_dataset={"train": Dataset.from_dict({"prompt": PROMPTS})}),
    rollout_row("dataset-prompt-none", "a `prompt` column holding None",
                r"prompt 0 must be a string or a list of \{'role', 'content'\} messages, got NoneType: None", "None",
                train_dataset=Dataset.from_dict({"prompt": [None] * 4, "id": [1, 2, 3, 4]})),
    # ---- formatters ----
    rollout_row("formatter-returns-none", "a formatter returning None", r"prompt 0 must be a string .* got NoneType: None",
                "NoneType", formatters=lambda item: None),
    rollout_row("formatter-returns-int", "a formatter returning an int", r"prompt 0 must be a string .* got int: 42", "42",
                formatters=lambda item: 42),
    rollout_row("formatter-returns-dict", "a formatter returning a dict (not a message list)",
                r"prompt 0 must be a string .* got dict: \{'text'", "{'text'",
                formatters=lambda item: {"text": item["prompt"]}),
    constructor_row("formatter-not-callable", "a formatters list with a non-callable entry",
                    r"formatters\[1\] must be callable, got int", "formatters[1]", formatters=[str, 3]),
    constructor_row("formatters-string", "formatters given as a string",
                    r"formatters must be a callable or a list of 2 callables, got str", "str", formatters="{prompt}"),
    # ---- tokenizers ----
    constructor_row("tokenizer-no-pad-no-eos", "a tokenizer with neither pad nor eos token",
                    r"tokenizer for agents\[0\] \(\w+\) has no eos_token", "agents[0]",
                    agents=None, agent_model="QWEN", tokenizer=_no_pad_no_eos()),
    constructor_row("tokenizer-is-a-path", "tokenizer given as a path string",
                    r"tokenizer must be a tokenizer or a list of tokenizers, got str", "str", tokenizer="./tokenizer"),
    constructor_row("tokenizer-list-entry", "a tokenizer list with a string entry",
                    r"tokenizer for agents\[1\] must be a transformers tokenizer, got str", "agents[1]",
                    tokenizer=[build_tokenizer("bpe"), "qwen"]),
    # ---- models and devices ----
    Row("agent-on-meta-device", "an agent whose weights are on the meta device (different from the other agent's cpu)",
        ValueError, r"agents\[1\] has parameters on the meta device", "agents[1]", "constructor",
        act=lambda ctx, meta: trainer(ctx, agents=[AutoModelForCausalLM.from_pretrained(ctx.dirs[1]), meta],
                                      tokenizer=build_tokenizer("bpe")),
        prepare=_meta_model),
    constructor_row("agent-missing-folder", "an agent path that does not exist",
                    r"agents\[1\]='\./models/agent_1' looks like a local path but does not exist", "./models/agent_1",
                    agents=["QWEN", "./models/agent_1"]),
    constructor_row("model-kwargs-not-dict", "model_config['model_kwargs'] not a dict",
                    r"model_config\['model_kwargs'\] must be a dict .* got list: \['trust_remote_code'\]",
                    "['trust_remote_code']", model_config={"model_kwargs": ["trust_remote_code"]}),
    constructor_row("model-config-not-dict", "model_config not a dict", r"model_config must be a dict, got str: 'bfloat16'",
                    "'bfloat16'", model_config="bfloat16"),
    constructor_row("model-config-two-dtypes", "model_config with both dtype and torch_dtype",
                    r"model_config sets both 'dtype' and 'torch_dtype'", "'torch_dtype'",
                    model_config={"dtype": "float32", "torch_dtype": "bfloat16"}),
    # ---- unknown keys ----
    config_row("config-unknown-key", "an unknown MAGRPOConfig key (typo)", r"unexpected keyword argument 'num_generation'",
               "num_generation", error=TypeError, num_generation=4),
    config_row("ac-config-unknown-key", "an unknown IACConfig key", r"unexpected keyword argument 'critic_typ'", "critic_typ",
               error=TypeError, cls=IACConfig, critic_typ="v"),
    constructor_row("trainer-unknown-argument", "an unknown trainer argument", r"unexpected keyword argument 'reward_fn'",
                    "reward_fn", error=TypeError, reward_fn=length_ratio_reward),
    # ---- zero, negative and non-finite sizes ----
    config_row("grad-accum-zero", "gradient_accumulation_steps=0", r"gradient_accumulation_steps must be an integer >= 1, got 0",
               "got 0", gradient_accumulation_steps=0),
    config_row("epochs-negative", "num_train_epochs=-1", r"num_train_epochs must be a finite number >= 0, got -1", "-1",
               num_train_epochs=-1),
    config_row("epochs-zero", "num_train_epochs=0 and no max_steps", r"num_train_epochs=0 with no max_steps trains nothing",
               "num_train_epochs=0", num_train_epochs=0),
    config_row("batch-size-zero", "per_device_train_batch_size=0", r"per_device_train_batch_size must be >= 1, got 0", "got 0",
               per_device_train_batch_size=0),
    config_row("eval-batch-size-zero", "per_device_eval_batch_size=0",
               r"per_device_eval_batch_size must be an integer >= 1, got 0", "got 0", per_device_eval_batch_size=0),
    config_row("turns-zero", "num_turns=0", r"num_turns must be an integer >= 1, got 0", "got 0", num_turns=0),
    config_row("tree-nodes-zero", "max_tree_nodes=0", r"max_tree_nodes must be an integer >= 1, got 0", "got 0", max_tree_nodes=0),
    config_row("min-new-tokens-negative", "min_new_tokens=-1", r"min_new_tokens must be an integer >= 0, got -1", "-1",
               min_new_tokens=-1),
    config_row("discount-above-one", "discount=1.5", r"discount must be in \[0, 1\], got 1.5", "1.5", discount=1.5),
    config_row("threshold-nan", "early_termination_threshold=NaN (would never stop an episode)",
               r"early_termination_threshold must be a number or None, got nan", "nan", early_termination_threshold=math.nan),
    config_row("temperature-nan", "temperature=NaN", r"temperature must be a finite number > 0, got nan", "nan",
               temperature=math.nan),
    config_row("learning-rate-negative", "agent_learning_rate=-1e-5", r"agent_learning_rate must be a finite number >= 0, got -1e-05",
               "-1e-05", agent_learning_rate=-1e-5),
    config_row("completions-to-print-negative", "num_completions_to_print=-1",
               r"num_completions_to_print must be an integer >= 0, got -1", "-1", num_completions_to_print=-1),
    config_row("ac-generations-zero", "IACConfig(num_generations=0)", r"num_generations must be an integer >= 1, got 0", "got 0",
               cls=IACConfig, num_generations=0),
    constructor_row("num-agents-negative", "num_agents=-1 as a trainer argument", r"num_agents must be a positive integer, got -1",
                    "-1", agents=None, agent_model="QWEN", num_agents=-1),
    Row("checkpoint-limit-zero", "train(checkpoint_total_limit=0)", ValueError,
        r"checkpoint_total_limit must be a positive integer, got 0", "got 0", "train()",
        prepare=lambda ctx: trainer(ctx), act=lambda ctx, t: t.train(checkpoint_dir=f"{OUT}/ck", checkpoint_total_limit=0)),
    # ---- checkpoints ----
    resume_row("checkpoint-other-trainer", "a MAGRPO checkpoint resumed by IACTrainer",
               r"was written by comlrl_hf\.trainers\.reinforce\.magrpo\.MAGRPOTrainer, not .*IACTrainer", "MAGRPOTrainer",
               tamper=lambda p: p, cls=IACTrainer, tokenizer="TOKENIZERS",
               args=IACConfig(output_dir=OUT, report_to=[], max_new_tokens=4, use_separate_critic=False)),
    resume_row("checkpoint-truncated-weights", "a checkpoint whose agent_0/model.safetensors is cut in half",
               r"agent_0/model\.safetensors does not match its recorded sha256", "agent_0/model.safetensors",
               tamper=_truncate("agent_0/model.safetensors")),
    resume_row("checkpoint-tampered-metadata", "comlrl_state.json edited by hand (env_step changed)",
               r"comlrl_state\.json was modified after it was written", "comlrl_state.json",
               tamper=_edit_metadata(lambda d: d.update(env_step=d["env_step"] + 8))),
    resume_row("checkpoint-metadata-checksum-removed", "comlrl_state.json without its checksum",
               r"comlrl_state\.json has no metadata_sha256", "metadata_sha256",
               tamper=_edit_metadata(lambda d: d.pop("metadata_sha256"))),
    resume_row("checkpoint-missing", "resume_from_checkpoint naming a folder that does not exist",
               r"checkpoint ck/checkpoint-9 does not exist", "ck/checkpoint-9", tamper=lambda p: "ck/checkpoint-9"),
    Row("checkpoint-is-an-export", "resume_from_checkpoint naming a save_model export", CheckpointError,
        r"out/export is not a comlrl_hf checkpoint: comlrl_state\.json is missing", "out/export", "resume",
        act=_export_folder),
]


class Context:
    def __init__(self, dirs, checkpoint):
        self.dirs, self._checkpoint = dirs, checkpoint

    def dataset(self):
        return Dataset.from_dict({"prompt": PROMPTS})

    def checkpoint(self):
        return self._checkpoint()


@pytest.fixture(scope="module")
def trained_checkpoint(tmp_path_factory, llama_dir, qwen_dir):
    """One epoch of MAGRPO on the tiny models, checkpointed once (built on first use)."""
    folder = tmp_path_factory.mktemp("bad-input-checkpoint")
    made = []

    def get():
        if not made:
            cwd = os.getcwd()
            os.chdir(folder)
            try:
                t = MAGRPOTrainer(agents=[llama_dir, qwen_dir], reward_func=length_ratio_reward,
                                  train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                                  args=config(num_train_epochs=1))
                t.train(checkpoint_dir="ck", checkpoint_interval=1)
            finally:
                os.chdir(cwd)
            made.append(str(folder / "ck" / "checkpoint-1"))
        return made[0]

    return get


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_input_is_refused_early_and_writes_nothing_outside_the_output_folder(row, llama_dir, qwen_dir,
                                                                                 trained_checkpoint, tmp_path):
    ctx = Context([llama_dir, qwen_dir], trained_checkpoint)
    assert os.getcwd() == str(tmp_path) and not os.listdir(tmp_path)
    prepared = row.prepare(ctx) if row.prepare else None
    model_dirs = {d: _tree(Path(d)) for d in ctx.dirs}
    before = _tree(tmp_path)
    target = prepared[0] if isinstance(prepared, tuple) else prepared
    weights = ([p.detach().clone() for a in target.agents for p in a.parameters()]
               if isinstance(target, MAGRPOTrainer | IACTrainer) else None)

    with pytest.raises(row.error, match=row.message) as info:
        row.act(ctx, prepared)

    assert row.names in str(info.value), f"the message does not name {row.names!r}: {info.value}"
    if row.check:
        row.check(info.value)
    if weights is not None:  # refused before any optimizer step or restore
        assert target.state.global_step == 0 and target.env_step == 0
        after = [p.detach() for a in target.agents for p in a.parameters()]
        assert all(torch.equal(a, b) for a, b in zip(weights, after))
    written = {p for p, stat in _tree(tmp_path).items() if before.get(p) != stat}
    assert {p for p in written if not p.startswith(OUT + os.sep)} == set(), written
    assert {d: _tree(Path(d)) for d in ctx.dirs} == model_dirs  # the model folders are untouched


def test_every_row_is_in_the_docs_table():
    docs = (Path(__file__).resolve().parent.parent / "docs" / "reliability.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\|.*\| `\[([\w-]+)\]` \|$", docs, flags=re.M))
    assert documented == {r.id for r in ROWS}


def markdown_table() -> str:
    """The table of docs/reliability.md, from ROWS (`python tests/test_bad_inputs.py`)."""
    lines = ["| # | bad input | error | raised at | test id |", "|---|---|---|---|---|"]
    for n, row in enumerate(ROWS, 1):
        message = row.message.replace("|", "\\|")
        lines.append(f"| {n} | {row.bad_input} | `{row.error.__name__}`: `{message}` | {row.where} | `[{row.id}]` |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
