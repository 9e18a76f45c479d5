"""Model placement on one machine (`agent_devices`, `critic_devices`), on CPU: placed runs equal unplaced ones
bitwise, the Trainer never moves the container, per-agent routing of advantages, RNG of every CUDA device, and
clear errors. (Real two-device runs: benchmarks/gpu_check.sh.)"""

import os

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Trainer

from comlrl_hf import IACConfig, IACTrainer, MAGRPOConfig, MAGRPOTrainer
from comlrl_hf.models.multi_agent import MultiAgentModel
from comlrl_hf.trainers import placement
from comlrl_hf.trainers.placement import CUDA_RNG_ALL_NAME, check_placement_world_size, parse_device, resolve_devices

from conftest import PROMPTS, length_ratio_reward

FAST = dict(output_dir="out", num_train_epochs=1, max_new_tokens=4, num_generations=2, report_to=[], logging_steps=1,
            disable_tqdm=True, agent_learning_rate=1e-3)


def _magrpo(dirs, **kw):
    return MAGRPOTrainer(agents=list(dirs), reward_func=length_ratio_reward,
                         train_dataset=Dataset.from_dict({"prompt": PROMPTS}), args=MAGRPOConfig(**{**FAST, **kw}))


def _iac(dirs, **kw):
    return IACTrainer(agents=list(dirs), tokenizer=[AutoTokenizer.from_pretrained(d) for d in dirs], critics=list(dirs),
                      reward_func=length_ratio_reward, train_dataset=Dataset.from_dict({"prompt": PROMPTS[:2]}),
                      args=IACConfig(**{**FAST, **kw}))


def _state(trainer):
    return [t.clone() for t in trainer.model.state_dict().values()]


def _logs(trainer):
    return [log for log in trainer.state.log_history if "loss" in log]


@pytest.fixture()
def moves(monkeypatch):
    """Every wholesale move of the container: Trainer's `_move_model_to_device` and `MultiAgentModel.to`
    (what accelerate's device placement calls)."""
    calls = []
    move, to = Trainer._move_model_to_device, MultiAgentModel.to

    def spy_move(self, model, device):
        calls.append(("_move_model_to_device", str(device)))
        return move(self, model, device)

    def spy_to(self, *args, **kwargs):
        calls.append(("MultiAgentModel.to", str(args or kwargs)))
        return to(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "_move_model_to_device", spy_move)
    monkeypatch.setattr(MultiAgentModel, "to", spy_to)
    return calls


@pytest.mark.parametrize("build, placed", [
    (_magrpo, dict(agent_devices=["cpu", "cpu"])),
    (_iac, dict(agent_devices="cpu", critic_devices=["cpu", "cpu"])),
], ids=["magrpo", "iac"])
def test_placed_run_equals_unplaced_run_bitwise_and_never_moves_the_container(llama_dir, qwen_dir, moves, build, placed):
    plain = build([llama_dir, qwen_dir])
    plain.train()
    # the spy sees the Trainer's wholesale moves of an unplaced container (so its silence below means something)
    assert ("_move_model_to_device", "cpu") in moves and any(name == "MultiAgentModel.to" for name, _ in moves)
    moves.clear()
    trainer = build([llama_dir, qwen_dir], **placed)
    assert trainer.args.place_model_on_device is False and trainer.is_model_parallel
    trainer.train()
    assert moves == []
    assert trainer.args.agent_devices == ["cpu", "cpu"] or trainer.args.agent_devices == ["cpu"]
    assert all(torch.equal(a, b) for a, b in zip(_state(plain), _state(trainer)))
    assert _logs(plain) == _logs(trainer) and _logs(trainer)[0]["grad_norm"] > 0  # it trained
    # placement is not part of the resume fingerprint: a checkpoint resumes on other devices
    assert plain.compatibility_fingerprint() == trainer.compatibility_fingerprint()


def test_advantages_are_routed_to_each_agents_device(llama_dir, qwen_dir):
    """A fake second device: agent 1's advantages must go to *its* device (meta here), not the trainer's."""
    for trainer in (_magrpo([llama_dir, qwen_dir], agent_devices=["cpu", "cpu"]),
                    _iac([llama_dir, qwen_dir], agent_devices=["cpu", "cpu"])):
        trainer._agent_devices = [torch.device("cpu"), torch.device("meta")]
        turns = trainer.rollout([{"prompt": p} for p in PROMPTS[:2]]).turns
        assert [a.device.type for a in turns[0].advantages] == ["cpu", "meta"]
        assert turns[0].rewards.device.type == "cpu"


def test_iac_critics_follow_their_agents_unless_critic_devices_says_otherwise(llama_dir, qwen_dir, monkeypatch):
    monkeypatch.setattr(placement, "parse_device", lambda field, value: torch.device(value))  # any device string
    trainer = _iac([llama_dir, qwen_dir], agent_devices=["cpu", "cpu"])
    assert trainer._critic_devices == [torch.device("cpu")] * 2
    with pytest.raises(ValueError, match=r"critic_devices has 3 entries \['cpu', 'cpu', 'cpu'\] but there are 2 critics"):
        _iac([llama_dir, qwen_dir], critic_devices=["cpu"] * 3)
    with pytest.raises(ValueError, match=r"critic_devices=\['cpu'\] needs separate critics"):
        IACTrainer(agents=[llama_dir, qwen_dir], tokenizer=[AutoTokenizer.from_pretrained(d) for d in (llama_dir, qwen_dir)],
                   reward_func=length_ratio_reward, train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                   args=IACConfig(**FAST, use_separate_critic=False, critic_devices=["cpu"]))


# ---- validation ----

def test_device_strings_are_checked_with_clear_errors(monkeypatch):
    assert parse_device("agent_devices", "cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"agent_devices: 'gpu:0' is not a torch device"):
        MAGRPOConfig(output_dir="out", agent_devices=["cpu", "gpu:0"])
    with pytest.raises(ValueError, match=r"agent_devices: 'meta' is not supported for placement"):
        MAGRPOConfig(output_dir="out", agent_devices=["meta"])
    with pytest.raises(ValueError, match=r"must be device strings such as 'cuda:0' or 'cpu', got 0"):
        MAGRPOConfig(output_dir="out", agent_devices=[0])
    with pytest.raises(ValueError, match=r"agent_devices has 3 entries .* but there are 2 agents"):
        MAGRPOConfig(output_dir="out", num_agents=2, agent_devices=["cpu"] * 3)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"agent_devices: 'cuda:5' needs CUDA, which is not available"):
            MAGRPOConfig(output_dir="out", agent_devices=["cpu", "cuda:5"])
    # a machine with two GPUs, simulated: cuda:1 exists, cuda:5 does not, "cuda" is the current device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert parse_device("agent_devices", "cuda:1") == torch.device("cuda", 1)
    assert parse_device("agent_devices", "cuda") == torch.device("cuda", 1)
    with pytest.raises(ValueError, match=r"'cuda:5' does not exist: 2 CUDA device\(s\) are visible \(cuda:0..cuda:1\)"):
        parse_device("agent_devices", "cuda:5")
    assert resolve_devices("agent_devices", ["cuda:0"], 3, "agents") == [torch.device("cuda", 0)] * 3


def test_placement_is_refused_with_several_processes():
    check_placement_world_size(2, None, None)
    with pytest.raises(ValueError, match=r"place models within one process, but this run has 2 processes"):
        check_placement_world_size(2, ["cuda:0", "cuda:1"], None)


def test_length_mismatch_against_the_trainers_agents(llama_dir, qwen_dir):
    with pytest.raises(ValueError, match=r"agent_devices has 3 entries \['cpu', 'cpu', 'cpu'\] but there are 2 agents"):
        _magrpo([llama_dir, qwen_dir], agent_devices=["cpu"] * 3)


def test_meta_device_weights_are_refused_before_placement_moves_them(qwen_dir):
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(qwen_dir))
    with pytest.raises(ValueError, match=r"agents\[1\] has parameters on the meta device"):
        MAGRPOTrainer(agents=[AutoModelForCausalLM.from_pretrained(qwen_dir), meta],
                      tokenizer=AutoTokenizer.from_pretrained(qwen_dir), reward_func=length_ratio_reward,
                      train_dataset=Dataset.from_dict({"prompt": PROMPTS}), args=MAGRPOConfig(**FAST, agent_devices="cpu"))


def test_shared_base_lora_on_two_devices_is_refused_before_loading(llama_dir, monkeypatch):
    loaded = []
    monkeypatch.setattr(placement, "parse_device", lambda field, value: torch.device(value))  # two fake GPUs
    monkeypatch.setattr("comlrl_hf.trainers.peft_support.load_causal_lm", lambda *a: loaded.append(a))
    args = MAGRPOConfig(**FAST)
    args.agent_devices = ["cuda:0", "cuda:1"]
    with pytest.raises(ValueError, match=r"peft_backend='shared' keeps every agent's adapter on one base model.*"
                                         r"pass peft_backend='separate'"):
        MAGRPOTrainer(agent_model=llama_dir, num_agents=2, reward_func=length_ratio_reward, args=args,
                      train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                      peft_config=LoraConfig(r=2, target_modules=["q_proj"]))
    assert loaded == []


# ---- RNG of every CUDA device ----

def test_every_cuda_devices_rng_is_saved_and_restored(llama_dir, qwen_dir, monkeypatch, tmp_path):
    """Simulated two-GPU machine: the checkpoint holds both devices' states and resume sets both back."""
    trainer = _magrpo([llama_dir, qwen_dir], agent_devices=["cpu", "cpu"])
    states = [torch.full((4,), 7, dtype=torch.uint8), torch.full((4,), 9, dtype=torch.uint8)]
    restored = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda.random, "get_rng_state", lambda device="cuda": states[0])
    monkeypatch.setattr(torch.cuda.random, "get_rng_state_all", lambda: states)
    monkeypatch.setattr(torch.cuda.random, "set_rng_state", lambda state, device="cuda": restored.__setitem__(device, state))
    trainer._save_rng_state(str(tmp_path))
    assert os.path.isfile(tmp_path / CUDA_RNG_ALL_NAME)
    trainer._load_rng_state(str(tmp_path))
    assert torch.equal(restored[0], states[0]) and torch.equal(restored[1], states[1])
