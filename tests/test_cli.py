"""The `comlrl-hf` command: recipes train end to end, flags override recipes, bad input is one line + exit 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from comlrl_hf import cli
from comlrl_hf.recipe import RecipeError, load_prompt_dataset, resolve_reward
from comlrl_hf.rewards import exact_match_reward, format_reward
from comlrl_hf.utils import read_checkpoint_metadata

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "examples" / "recipes" / "length_ratio.yaml"


def _one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    errors = [line for line in err if ": error: " in line]
    assert len(errors) == 1, err
    return errors[0]


def test_length_ratio_recipe_trains_end_to_end(qwen_dir, tmp_path, capsys):
    code = cli.main(["magrpo", "--config", str(RECIPE), "--agent_model", qwen_dir, "--max_new_tokens", "4",
                     "--num_train_epochs", "1", "--output_dir", str(tmp_path / "out"),
                     "--checkpoint_dir", str(tmp_path / "ck"), "--disable_tqdm", "true"])
    assert code == 0
    # The recipe's 4 prompts, 2 per step, 4 generations each: 2 steps and 16 scored joint actions.
    meta = read_checkpoint_metadata(tmp_path / "ck" / "checkpoint-1")
    assert meta["env_step"] == 16 and meta["trainer_class"].endswith(".MAGRPOTrainer")
    state = json.loads((tmp_path / "ck" / "checkpoint-1" / "trainer_state.json").read_text())
    rewards = [log["reward"] for log in state["log_history"] if "reward" in log]
    assert len(rewards) == 2 and all(0 < r <= 1 for r in rewards)
    for i in range(2):
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "final" / f"agent_{i}")
        assert model.config.model_type == "qwen2"
    assert "agents saved to" in capsys.readouterr().err


def test_flags_override_the_recipe_and_resume_latest(qwen_dir, tmp_path):
    args = ["magrpo", "--config", str(RECIPE), "--agent_model", qwen_dir, "--max_new_tokens", "3",
            "--num_generations", "2", "--output_dir", str(tmp_path / "out"), "--checkpoint_dir", str(tmp_path / "ck"),
            "--disable_tqdm", "true"]
    assert cli.main(args + ["--num_train_epochs", "1"]) == 0
    assert read_checkpoint_metadata(tmp_path / "ck" / "checkpoint-1")["env_step"] == 8  # 2 steps x 2 prompts x 2
    assert cli.main(args + ["--num_train_epochs", "2", "--resume_from_checkpoint", "latest"]) == 0
    assert read_checkpoint_metadata(tmp_path / "ck" / "checkpoint-2")["env_step"] == 16


@pytest.mark.parametrize("command", ["iac", "maac"])
def test_actor_critic_commands_train_heterogeneous_agents(command, llama_dir, qwen_dir, tmp_path):
    recipe = tmp_path / "ac.yaml"
    critic = {"iac": f"critics: [{llama_dir}, {qwen_dir}]", "maac": f"critic_model: {llama_dir}"}[command]
    recipe.write_text(
        f"agents: [{llama_dir}, {qwen_dir}]\n{critic}\nreward_func: space_share\nprompts: [Hello there, Say hi]\n"
        f"num_train_epochs: 1\nmax_new_tokens: 3\nnum_generations: 2\nreport_to: none\ndisable_tqdm: true\n"
        f"output_dir: {tmp_path / 'out'}\n"
    )
    assert cli.main([command, "--config", str(recipe)]) == 0
    final = tmp_path / "out" / "final"
    heads = {"iac": [final / "agent_0" / "critic" / "value_head.pt", final / "agent_1" / "critic" / "value_head.pt"],
             "maac": [final / "critic" / "value_head.pt"]}[command]
    for head in heads:
        assert torch.load(head, weights_only=True)
    assert AutoModelForCausalLM.from_pretrained(final / "agent_0").config.model_type == "llama"


@pytest.mark.parametrize(
    "recipe, flags, names",
    [
        ("num_generatons: 2\n", [], ["unknown key 'num_generatons'", "did you mean 'num_generations'"]),
        ("num_generations: four\n", [], ["num_generations expects an integer", "'four'"]),
        ("temperature: [0.5]\n", [], ["temperature expects a number"]),
        ("num_generations: null\n", [], ["num_generations may not be null"]),
        ("loss_type: sum\n", [], ["loss_type expects one of", "'sum'"]),
        ("", ["--reward_func", "lenght_ratio"], ["unknown reward_func 'lenght_ratio'", "length_ratio"]),
        ("", ["--reward_func", "no_such_module:f"], ["cannot import 'no_such_module'"]),
        ("", ["--top_p", "wide"], ["--top_p", "'wide'"]),
        ("", ["--no_such_flag", "1"], ["unrecognized arguments: --no_such_flag"]),
        ("", ["--top_p", "1.5"], ["top_p must be in (0, 1]", "1.5"]),
        ("", ["--dataset", "missing.csv", "--prompts"], ["expected at least one argument"]),
        ("", ["--prompts", "a", "--dataset", "missing.jsonl"], ["give either prompts or dataset"]),
        ("", ["--wandb_config", "{oops"], ["wandb_config must be a JSON object"]),
    ],
)
def test_bad_recipes_and_flags_are_one_line_and_exit_2(recipe, flags, names, qwen_dir, tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(f"agent_model: {qwen_dir}\nreward_func: length_ratio\nprompts: [a, b]\n" + recipe)
    assert cli.main(["magrpo", "--config", str(path), *flags]) == 2
    line = _one_error_line(capsys)
    assert line.startswith("comlrl-hf magrpo: error: ")
    for name in names:
        assert name in line


def test_marlhf_command_learns_a_reward_model_and_trains_against_it(qwen_dir, llama_dir, tmp_path):
    recipe = tmp_path / "pbrl.yaml"
    recipe.write_text(
        f"agent_model: {qwen_dir}\nreward_model_name: {llama_dir}\nreward_model_device: cpu\nreward_func: space_share\n"
        f"prompts: [Hello there, Say hi]\nnum_train_epochs: 1\nmax_new_tokens: 4\npreference_num_candidates: 4\n"
        f"rl_algorithm: marloo\nreport_to: none\ndisable_tqdm: true\noutput_dir: {tmp_path / 'out'}\n"
    )
    assert cli.main(["marlhf", "--config", str(recipe)]) == 0
    final = tmp_path / "out" / "final"
    assert AutoModelForSequenceClassification.from_pretrained(final / "reward_model").config.model_type == "llama"
    assert (tmp_path / "out" / "preference" / "iteration_0.json").is_file()


def test_agent_mismatch_from_the_trainer_is_exit_2(llama_dir, qwen_dir, capsys):
    assert cli.main(["magrpo", "--agent_model", llama_dir, "--agents", llama_dir, qwen_dir, "--prompts", "a",
                     "--reward_func", "length_ratio"]) == 2
    assert "conflicts with agents[1]" in _one_error_line(capsys)


def test_a_command_whose_trainer_is_missing_says_so(monkeypatch, capsys):
    monkeypatch.setitem(cli.COMMANDS, "future", cli.Command("comlrl_hf.trainers.not_yet", "FutureTrainer",
                                                            "FutureConfig", "later"))
    assert cli.main(["future", "--config", "x.yaml"]) == 2
    assert "FutureTrainer is not available in this version" in _one_error_line(capsys)
    assert "marlhf" in cli.COMMANDS
    assert cli.main(["nonsense"]) == 2
    assert "unknown command 'nonsense'" in _one_error_line(capsys)


def test_help_shows_every_fields_help(capsys):
    assert cli.main(["iac", "--help"]) == 0
    out = capsys.readouterr().out
    for text in ("Samples per agent per prompt", "One separate critic model per agent", "Joint reward: a built-in name",
                 "Total number of training epochs", "--config", "--per_device_train_batch_size"):
        assert text in " ".join(out.split()), text
    assert cli.main(["--help"]) == 0 and "maac" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["json", "jsonl", "csv", "parquet"])
def test_local_dataset_files(kind, tmp_path):
    from datasets import Dataset

    data = Dataset.from_dict({"question": ["Q1", "Q2", "Q3"], "answer": ["1", "2", "3"]})
    path = str(tmp_path / f"data.{kind}")
    {"json": lambda p: data.to_json(p, lines=False), "jsonl": data.to_json, "csv": data.to_csv,
     "parquet": data.to_parquet}[kind](path)
    loaded = load_prompt_dataset(path, split="train", config_name=None, prompt_column="question")
    assert loaded["prompt"] == ["Q1", "Q2", "Q3"] and [str(a) for a in loaded["answer"]] == ["1", "2", "3"]


def test_reward_by_file_path_next_to_the_recipe_with_kwargs(qwen_dir, tmp_path):
    (tmp_path / "my_rewards.py").write_text("def scaled(c1, c2, scale=1.0):\n    return [scale * len(a + b) for a, b in zip(c1, c2)]\n")
    reward = resolve_reward(str(tmp_path / "my_rewards.py") + ":scaled", {"scale": 0.5})
    assert reward(["ab"], ["cdef"]) == [3.0]
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"agent_model: {qwen_dir}\nreward_func: my_rewards.py:scaled\nreward_kwargs: {{scale: 0.001}}\n"
                      "prompts: [a, b]\nnum_train_epochs: 1\nmax_new_tokens: 2\nnum_generations: 2\nreport_to: none\n"
                      f"output_dir: {tmp_path / 'o'}\ndisable_tqdm: true\n")
    os.chdir(tmp_path.parent)  # the relative file name is found next to the recipe, not in the working directory
    assert cli.main(["magrpo", "--config", str(recipe)]) == 0
    with pytest.raises(RecipeError, match="has no attribute 'nope'"):
        resolve_reward(str(tmp_path / "my_rewards.py") + ":nope", None)


def test_builtin_rewards_by_hand():
    assert format_reward(["Done.", "no end"], ["Yes!", ""]) == [1.0, 0.0]
    assert format_reward(["<a>x</a>"], ["x"], pattern=r"<a>.*</a>") == [0.5]
    items = [{"answer": " 42"}, {"answer": "7"}]
    assert exact_match_reward(["42", "7"], ["41", "7\n"], batch_items=items) == [0.5, 1.0]
    with pytest.raises(ValueError, match="needs a 'answer' column"):
        exact_match_reward(["1"], batch_items=[{"label": "1"}])


def test_module_entry_point_in_a_subprocess(tmp_path):
    (tmp_path / "r.yaml").write_text("agent_model: x\nmax_new_tokens: -3\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "comlrl_hf.cli", "magrpo", "--config", str(tmp_path / "r.yaml")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if ": error: " in line]
    assert lines == ["comlrl-hf magrpo: error: MAGRPOConfig: max_new_tokens must be an integer >= 1, got -3"]
