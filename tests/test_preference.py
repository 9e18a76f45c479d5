"""MARLHF / MARLHFIter: the spec §3 example, reward-model learning, freezing, stage resume, backends, errors."""

import json
import logging
import os

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForSequenceClassification

from comlrl_hf.models.reward_model import load_reward_model, resolve_reward_model_device
from comlrl_hf.testing import build_tiny_model, build_tokenizer
from comlrl_hf.trainers.actor_critic import IACTrainer, MAACTrainer
from comlrl_hf.trainers.preference import MARLHFConfig, MARLHFIterConfig, MARLHFIterTrainer, MARLHFTrainer
from comlrl_hf.trainers.reinforce import MAGRPOTrainer
from comlrl_hf.utils import read_checkpoint_metadata

from conftest import PROMPTS, length_ratio_reward, space_share_reward

FAST = dict(max_new_tokens=6, report_to=[], disable_tqdm=True, logging_steps=1, agent_learning_rate=1e-3,
            preference_num_candidates=4, preference_pairs_per_sample=3, reward_learning_rate=1e-3,
            reward_model_device=None)


def _config(cls=MARLHFConfig, **kw):
    return cls(**{"output_dir": "out", "num_train_epochs": 1, **FAST, **kw})


def _build(model_dir, cls=MARLHFTrainer, config_cls=MARLHFConfig, reward_func=length_ratio_reward, **kw):
    return cls(agent_model=model_dir, num_agents=2, reward_func=reward_func,
               train_dataset=Dataset.from_dict({"prompt": PROMPTS}), eval_dataset=Dataset.from_dict({"prompt": PROMPTS}),
               args=_config(config_cls, **kw))


def _weights(trainer):
    models = list(trainer.agents) + list(trainer._container.critics or []) + [trainer.reward_model]
    return [t.clone() for m in models for t in m.state_dict().values()]


def _same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _step_logs(trainer):
    return [log for log in trainer.state.log_history if "loss" in log]


def _count_stages(trainer):
    calls = {"pairs": 0, "reward_model": 0}
    collect, fit = trainer.collect_pairs, trainer.fit_reward_model

    def counted_collect(*a, **k):
        calls["pairs"] += 1
        return collect(*a, **k)

    def counted_fit(*a, **k):
        calls["reward_model"] += 1
        return fit(*a, **k)

    trainer.collect_pairs, trainer.fit_reward_model = counted_collect, counted_fit
    return calls


def test_spec_example_runs_on_tiny_models(qwen_dir, llama_dir, caplog):
    """Spec §3 with tiny local models; the default reward_model_device "cuda:0" falls back on a CPU machine."""
    args = MARLHFConfig(num_agents=2, num_turns=1, reward_model_name=llama_dir, reward_model_device="cuda:0",
                        output_dir="out", num_train_epochs=1, **{k: v for k, v in FAST.items() if k != "reward_model_device"})
    with caplog.at_level(logging.WARNING):
        trainer = MARLHFTrainer(agent_model=qwen_dir, num_agents=2, reward_func=length_ratio_reward,
                                train_dataset=Dataset.from_dict({"prompt": PROMPTS}), args=args)
    if not torch.cuda.is_available():
        assert "CUDA is not available" in caplog.text
    assert isinstance(trainer, MARLHFTrainer) and isinstance(trainer, MAGRPOTrainer)
    trainer.train()
    assert next(trainer.reward_model.parameters()).device == trainer.args.device
    assert trainer.reward_model.config.model_type == "llama"  # its own backbone, not the agents'
    trainer.save_model("saved")
    assert sorted(os.listdir("saved")) == ["agent_0", "agent_1", "reward_model", "training_args.json"]
    reloaded = AutoModelForSequenceClassification.from_pretrained("saved/reward_model")
    ids = trainer.reward_tokenizer(["[Agent 0 prompt]\nhi"], return_tensors="pt")
    assert all(torch.equal(a, b) for a, b in zip(reloaded.state_dict().values(), trainer.reward_model.state_dict().values()))
    # same weights; CPU kernels may round differently on the file's memory alignment
    assert torch.allclose(reloaded(**ids).logits, trainer.reward_model(**ids).logits, rtol=0, atol=1e-6)
    # the RL reward is the reward model's; evaluation scores with the task reward
    evaluation = trainer.evaluate(Dataset.from_dict({"prompt": PROMPTS[:2]}))
    assert 0 < evaluation["eval_reward"] <= 1


def test_reward_model_accuracy_on_held_out_pairs_rises_above_chance(llama_dir):
    """A task reward the tiny model's text can reveal (share of spaces): held-out accuracy rises from chance."""
    trainer = MARLHFTrainer(
        agent_model=llama_dir, num_agents=2, reward_func=space_share_reward,
        train_dataset=Dataset.from_dict({"prompt": [f"Prompt number {i}: tell me something" for i in range(8)]}),
        args=_config(max_new_tokens=8, preference_num_candidates=16, preference_pairs_per_sample=24,
                     pair_selection="random", reward_num_train_epochs=3, reward_eval_fraction=0.25,
                     per_device_train_batch_size=4, reward_train_batch_size=16))
    pairs = trainer.collect_pairs(0)
    assert len(pairs) == 8 * 24 and all(p["chosen_reward"] > p["rejected_reward"] for p in pairs)
    history = trainer.fit_reward_model(0, pairs)
    before, after = history["eval_accuracy_before"], history["epochs"][-1]["eval_accuracy"]
    assert history["eval_pairs"] == 48
    assert before <= 0.55 and after >= 0.6 and after > before + 0.1, (before, history["epochs"])


def test_frozen_backbone_is_bitwise_unchanged_and_only_the_head_learns(qwen_dir):
    trainer = _build(qwen_dir, reward_freeze_backbone=True, reward_num_train_epochs=2)
    pairs = trainer.collect_pairs(0)
    trainer.fit_reward_model(0, pairs)
    fresh, _ = load_reward_model(qwen_dir, {}, torch.device("cpu"), seed=trainer.args.seed + 1_000_003 + 1)
    trained = dict(trainer.reward_model.named_parameters())
    backbone = {n for n, _ in trainer.reward_model.base_model.named_parameters(prefix=trainer.reward_model.base_model_prefix)}
    assert backbone and all(torch.equal(trained[n], p) for n, p in fresh.named_parameters() if n in backbone)
    head = [n for n in trained if n not in backbone]
    assert head == ["score.weight"] and not torch.equal(trained["score.weight"], dict(fresh.named_parameters())["score.weight"])


def test_resume_from_every_stage_is_bitwise_and_skips_finished_stages(qwen_dir):
    full = _build(qwen_dir, num_train_epochs=2)
    full.train(checkpoint_dir="ck")
    assert sorted(os.listdir("ck")) == ["checkpoint-1", "checkpoint-2", "checkpoint-3", "checkpoint-4"]
    stages = [read_checkpoint_metadata(f"ck/checkpoint-{k}")["extra"] for k in (1, 2, 3)]
    assert [(s["pairs_collected"], s["reward_model_trained"]) for s in stages] == [(True, False), (True, True), (True, True)]
    expected = {1: {"pairs": 0, "reward_model": 1}, 2: {"pairs": 0, "reward_model": 0}, 3: {"pairs": 0, "reward_model": 0}}
    for k, calls_expected in expected.items():
        resumed = _build(qwen_dir, num_train_epochs=2)
        calls = _count_stages(resumed)
        resumed.train(resume_from_checkpoint=f"ck/checkpoint-{k}", checkpoint_dir=f"ck{k}")
        assert calls == calls_expected, k
        assert _same(_weights(full), _weights(resumed)), k
        assert _step_logs(full) == _step_logs(resumed) and resumed.env_step == full.env_step, k
        assert resumed.preference_history == full.preference_history
    with open("ck/checkpoint-1/preference_state.json") as f:
        assert len(json.load(f)["stage"]["pairs"]) == len(full._stage["pairs"]) > 0


def test_iterations_resume_across_boundaries_and_can_be_raised(llama_dir):
    full = _build(llama_dir, MARLHFIterTrainer, MARLHFIterConfig, num_train_epochs=1, num_iterations=2)
    calls = _count_stages(full)
    full.train(checkpoint_dir="full")
    assert calls == {"pairs": 2, "reward_model": 2} and full.args.num_train_epochs == 1
    assert [h["iteration"] for h in full.preference_history] == [0, 1]
    assert len(os.listdir("full")) == 6  # per iteration: pairs, reward model, one RL epoch

    first = _build(llama_dir, MARLHFIterTrainer, MARLHFIterConfig, num_train_epochs=1, num_iterations=1)
    first.train(checkpoint_dir="ck")
    longer = _build(llama_dir, MARLHFIterTrainer, MARLHFIterConfig, num_train_epochs=1, num_iterations=2)
    longer.train(resume_from_checkpoint=True, checkpoint_dir="ck")  # one more iteration
    assert _same(_weights(full), _weights(longer)) and _step_logs(full) == _step_logs(longer)

    mid = _build(llama_dir, MARLHFIterTrainer, MARLHFIterConfig, num_train_epochs=1, num_iterations=2)
    calls = _count_stages(mid)
    mid.train(resume_from_checkpoint="full/checkpoint-4", checkpoint_dir="mid")  # iteration 1's pairs
    assert calls == {"pairs": 0, "reward_model": 1}
    assert _same(_weights(full), _weights(mid)) and mid.preference_history == full.preference_history
    # a stage checkpoint written by a resumed run resumes exactly too (it must carry the restored RNG)
    chained = _build(llama_dir, MARLHFIterTrainer, MARLHFIterConfig, num_train_epochs=1, num_iterations=2)
    chained.train(resume_from_checkpoint="mid/checkpoint-5", checkpoint_dir="chained")
    assert _same(_weights(full), _weights(chained)) and _step_logs(full) == _step_logs(chained)


@pytest.mark.parametrize("algorithm, backend", [("iac", IACTrainer), ("maac", MAACTrainer)])
def test_actor_critic_backends_train_against_the_reward_model(qwen_dir, algorithm, backend):
    trainer = _build(qwen_dir, rl_algorithm=algorithm, num_generations=2)
    assert isinstance(trainer, backend) and isinstance(trainer, MARLHFTrainer)
    trainer.train(checkpoint_dir="ck")
    assert trainer.critics is not None and trainer.env_step == len(PROMPTS) * 2
    trainer.save_model("saved")
    critic = os.path.join("saved", "critic") if algorithm == "maac" else os.path.join("saved", "agent_0", "critic")
    assert os.path.isfile(os.path.join(critic, "value_head.pt")) and os.path.isdir("saved/reward_model")
    resumed = _build(qwen_dir, rl_algorithm=algorithm, num_generations=2)
    resumed.train(resume_from_checkpoint="ck/checkpoint-2", checkpoint_dir="ck2")  # after the reward model
    assert _same(_weights(trainer), _weights(resumed))


def test_resumed_output_goes_to_a_resume_folder(qwen_dir):
    first = _build(qwen_dir, num_train_epochs=1)
    first.train(checkpoint_dir="ck")
    assert os.path.isfile("out/preference/iteration_0.json")
    again = _build(qwen_dir, num_train_epochs=2)
    again.train(resume_from_checkpoint=True, checkpoint_dir="ck")
    assert again._artifact_dir == os.path.join("out", "resume-1")
    assert not os.path.exists("out/resume-1/preference")  # the restored stages wrote nothing new


def test_reward_model_device_resolution(monkeypatch):
    cpu = torch.device("cpu")
    assert resolve_reward_model_device(None, cpu) == cpu
    assert resolve_reward_model_device("cpu", cpu) == cpu
    with pytest.raises(ValueError, match="'gpu:0' is not a torch device"):
        resolve_reward_model_device("gpu:0", cpu)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_reward_model_device("cuda:1", cpu) == torch.device("cuda", 1)
    with pytest.raises(ValueError, match="'cuda:5' does not exist: 2 CUDA device"):
        resolve_reward_model_device("cuda:5", cpu)


@pytest.mark.parametrize("settings, message", [
    (dict(rl_algorithm="ppo"), "rl_algorithm must be one of"),
    (dict(num_turns=2), "single-turn aligned episodes; got num_turns=2"),
    (dict(joint_mode="cross"), "joint_mode='cross'"),
    (dict(pair_selection="all"), "preference_pairs_per_sample must be None, got 3"),
    (dict(pair_selection="best"), "pair_selection must be one of"),
    (dict(preference_num_candidates=1), "preference_num_candidates must be >= 2"),
    (dict(preference_pairs_per_sample=0), "preference_pairs_per_sample must be an integer >= 1 or None, got 0"),
    (dict(reward_learning_rate=0.0), "reward_learning_rate must be a finite number > 0, got 0.0"),
    (dict(reward_train_batch_size=0), "reward_train_batch_size must be an integer >= 1, got 0"),
    (dict(reward_eval_fraction=1.0), r"reward_eval_fraction must be in \[0, 1\), got 1.0"),
    (dict(reward_max_length=0), "reward_max_length must be an integer >= 1 or None, got 0"),
    (dict(rl_algorithm="iac", advantage_mode="max"), "advantage_mode applies to the MAGRPO family"),
    (dict(rl_algorithm="magrpo", num_generations=1), "num_generations must be >= 2"),
    (dict(rl_algorithm="maac", critic_type="x"), "critic_type must be 'v' or 'q'"),
])
def test_bad_preference_configs_name_the_value(settings, message):
    with pytest.raises(ValueError, match=message):
        _config(**settings)


def test_bad_iteration_configs():
    with pytest.raises(ValueError, match="num_iterations must be an integer >= 1, got 0"):
        _config(MARLHFIterConfig, num_iterations=0)
    with pytest.raises(ValueError, match="whole number >= 1, got 1.5"):
        _config(MARLHFIterConfig, num_train_epochs=1.5)


def test_construction_errors(qwen_dir, tmp_path):
    tokenizer = build_tokenizer("bpe")
    objects = [build_tiny_model("qwen2", tokenizer, seed=s) for s in (0, 1)]
    with pytest.raises(ValueError, match="reward_model_name is required"):
        MARLHFTrainer(agents=objects, tokenizer=tokenizer, reward_func=length_ratio_reward, args=_config())
    with pytest.raises(ValueError, match="critic_model_name is required"):
        MARLHFTrainer(agents=objects, tokenizer=tokenizer, reward_func=length_ratio_reward,
                      args=_config(rl_algorithm="maac", reward_model_name=qwen_dir))
    with pytest.raises(ValueError, match="critic_model / critics / critic_peft_config need rl_algorithm 'iac' or 'maac', got 'magrpo'"):
        MARLHFTrainer(agent_model=qwen_dir, reward_func=length_ratio_reward, critic_model=qwen_dir, args=_config())
    with pytest.raises(OSError):  # a reward-model source that does not exist fails at construction
        MARLHFTrainer(agent_model=qwen_dir, reward_func=length_ratio_reward,
                      args=_config(reward_model_name=str(tmp_path / "missing")))
    with pytest.raises(ValueError, match="needs args of type MARLHFIterConfig"):
        MARLHFIterTrainer(agent_model=qwen_dir, reward_func=length_ratio_reward, args=_config())
    # model objects with a reward model named explicitly are fine
    trainer = MARLHFTrainer(agents=objects, tokenizer=tokenizer, reward_func=length_ratio_reward,
                            args=_config(reward_model_name=qwen_dir))
    assert trainer.num_agents == 2


def test_lora_agents_on_a_shared_base_learn_against_the_reward_model(qwen_dir):
    from peft import LoraConfig

    trainer = MARLHFTrainer(agent_model=qwen_dir, num_agents=2, reward_func=length_ratio_reward,
                            train_dataset=Dataset.from_dict({"prompt": PROMPTS}), args=_config(),
                            peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    assert trainer.peft_backend == "shared"
    before = [p.clone() for p in trainer.agents[1].parameters()]
    trainer.train(checkpoint_dir="ck")
    assert not all(torch.equal(a, b) for a, b in zip(before, trainer.agents[1].parameters()))
    trainer.save_model("saved")
    assert os.path.isfile("saved/agent_1/adapter_config.json") and os.path.isdir("saved/reward_model")
    resumed = MARLHFTrainer(agent_model=qwen_dir, num_agents=2, reward_func=length_ratio_reward,
                            train_dataset=Dataset.from_dict({"prompt": PROMPTS}), args=_config(),
                            peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    resumed.train(resume_from_checkpoint="ck/checkpoint-2", checkpoint_dir="ck2")
    assert _same([p for a in trainer.agents for p in a.parameters()] + [trainer.reward_model.score.weight],
                 [p for a in resumed.agents for p in a.parameters()] + [resumed.reward_model.score.weight])
