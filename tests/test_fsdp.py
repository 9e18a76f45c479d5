"""FSDP2: a real 2-process run on CPU (gloo), each agent sharded with `fully_shard`, against the 1-process run
with the same global batch; exact resume under FSDP; checkpoints usable without FSDP; unsupported settings
refused at construction."""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ddp_worker  # noqa: E402

FSDP_ENV = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _max_gap(a: dict, b: dict) -> float:
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def test_two_process_fsdp2_magrpo_equals_one_process_and_resumes_exactly(llama_dir, qwen_dir, tmp_path):
    out = tmp_path / "fsdp"
    env = {**os.environ, **FSDP_ENV, "ACCELERATE_USE_CPU": "true", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(_free_port()), os.path.join(HERE, "fsdp_worker.py"), str(out), str(llama_dir),
               str(qwen_dir)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]

    logs = [json.load(open(out / f"logs_rank{r}.json")) for r in range(2)]
    # each process holds its own part of every agent: the parts add up to the agents, neither holds them whole
    assert logs[0]["resharded"] and logs[1]["resharded"]  # after generate, no layer stays whole
    assert logs[0]["local"] + logs[1]["local"] == logs[0]["total"] and max(log["local"] for log in logs) < 0.6 * logs[0]["total"]
    states = torch.load(out / "states.pt", weights_only=True)
    full = {f"agent_{i}.{k}": v for i, s in enumerate(states["full"]["agents"]) for k, v in s.items()}
    resumed = {f"agent_{i}.{k}": v for i, s in enumerate(states["resumed"]["agents"]) for k, v in s.items()}
    # resume under FSDP (full weights and optimizer loaded back into the shards) is bitwise exact
    assert full.keys() == resumed.keys()
    assert all(torch.equal(full[k], resumed[k]) for k in full), _max_gap(full, resumed)
    opt_full, opt_resumed = states["full"]["optimizer"], states["resumed"]["optimizer"]
    assert opt_full["state"].keys() == opt_resumed["state"].keys() and len(opt_full["state"]) > 0
    assert all(torch.equal(opt_full["state"][k][n], opt_resumed["state"][k][n]) for k in opt_full["state"] for n in opt_full["state"][k])
    assert logs[0]["full"] == logs[0]["resumed"] and logs[0]["env_step"] == [64, 64] and logs[1]["full"] == logs[0]["full"]
    assert {"rng_state_0.pth", "rng_state_1.pth", "optimizer.pt"} <= set(logs[0]["files"])

    # the last checkpoint holds the gathered weights in the plain layout: from_pretrained, no FSDP
    last = out / "full" / "checkpoint-2"
    for i in range(2):
        plain = AutoModelForCausalLM.from_pretrained(last / f"agent_{i}").state_dict()
        assert all(torch.equal(plain[k], states["full"]["agents"][i][k]) for k in plain)
    saved_opt = torch.load(last / "optimizer.pt", weights_only=True)  # Optimizer.state_dict() form (numbered)
    assert sorted(saved_opt["state"]) == list(range(len(saved_opt["state"])))
    assert [g["name"] for g in saved_opt["param_groups"]] == ["agent_0", "agent_1"]
    assert all(torch.equal(saved_opt["state"][k]["exp_avg"], opt_full["state"][k]["exp_avg"]) for k in saved_opt["state"])

    # one process without FSDP, same global batch (4 prompts per step), same seeded samples
    os.chdir(tmp_path)
    single = ddp_worker.build("grpo", [llama_dir, qwen_dir], 1)
    single.train()
    expected = {f"agent_{i}.{k}": v for i, agent in enumerate(single.agents) for k, v in agent.state_dict().items()}
    initial = {f"agent_{i}.{k}": v for i, d in enumerate((llama_dir, qwen_dir))
               for k, v in AutoModelForCausalLM.from_pretrained(d).state_dict().items()}
    moved, gap = _max_gap(expected, initial), _max_gap(expected, full)
    assert moved > 1e-3 and gap < 2e-5, (moved, gap)  # float-summation order only
    one = ddp_worker.step_logs(single)
    assert len(one) == len(logs[0]["full"]) == 4
    for a, b in zip(logs[0]["full"], one):
        assert a["env_step"] == b["env_step"] and a["reward"] == pytest.approx(b["reward"], abs=1e-6)  # same samples
        for key in ("grad_norm", "agent_0/grad_norm", "agent_1/grad_norm", "agent_0/entropy"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)


def _magrpo(llama_dir, **config):
    from comlrl_hf import MAGRPOConfig, MAGRPOTrainer
    from comlrl_hf.rewards import length_ratio_reward

    args = MAGRPOConfig(output_dir="out", report_to=[], max_new_tokens=4, num_generations=2, **config)
    return MAGRPOTrainer(agent_model=str(llama_dir), num_agents=2, reward_func=length_ratio_reward,
                         train_dataset=Dataset.from_dict({"prompt": ["a", "b"]}), args=args)


@pytest.mark.parametrize("env, config, message", [
    ({"FSDP_VERSION": "1"}, {}, r"FSDP version 1 is not supported; use FSDP2"),
    ({"FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT"}, {}, r"state_dict_type SHARDED_STATE_DICT is not supported"),
    ({"FSDP_OFFLOAD_PARAMS": "true"}, {}, r"fsdp_offload_params: true\) is not supported"),
    ({"FSDP_ACTIVATION_CHECKPOINTING": "true"}, {}, r"activation checkpointing .* is not supported"),
    ({"FSDP_CPU_RAM_EFFICIENT_LOADING": "true"}, {}, r"fsdp_cpu_ram_efficient_loading: true is not supported"),
    ({"FSDP_AUTO_WRAP_POLICY": "SIZE_BASED_WRAP"}, {}, r"auto_wrap_policy size_based_auto_wrap_policy is not supported"),
    ({}, {"early_termination_threshold": 0.5}, r"early_termination_threshold=0.5 is not supported"),
    ({}, {}, r"FSDP needs a distributed launch"),
])
def test_unsupported_fsdp_settings_are_refused_before_loading(llama_dir, monkeypatch, env, config, message):
    for name, value in {**FSDP_ENV, **env}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        _magrpo(llama_dir, **config)


def test_fsdp_is_refused_for_other_trainers_and_lora(llama_dir, monkeypatch):
    from peft import LoraConfig

    from comlrl_hf import IACConfig, IACTrainer

    for name, value in FSDP_ENV.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=r"FSDP is not supported by IACTrainer yet"):
        IACTrainer(agent_model=str(llama_dir), num_agents=1, reward_func=lambda c: [0.0] * len(c),
                   args=IACConfig(output_dir="out", report_to=[]))
    with pytest.raises(ValueError, match=r"FSDP with peft_config \(LoRA agents\) is not supported"):
        from comlrl_hf import MAGRPOConfig, MAGRPOTrainer

        MAGRPOTrainer(agent_model=str(llama_dir), num_agents=2, reward_func=lambda a, b: [0.0] * len(a),
                      args=MAGRPOConfig(output_dir="out", report_to=[]), peft_config=LoraConfig(r=2))
