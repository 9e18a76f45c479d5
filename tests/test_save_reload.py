"""save_model -> agent_i/ folders -> a new trainer built from them: weights and tokenizers bitwise equal."""

import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl_hf import MAGRPOConfig, MAGRPOTrainer

from conftest import length_ratio_reward


def _config(**kw):
    return MAGRPOConfig(num_train_epochs=1, max_new_tokens=8, report_to=[], agent_learning_rate=1e-3, **kw)


@pytest.mark.parametrize("kind", ["homogeneous", "heterogeneous"])
def test_save_reload_bitwise(kind, llama_dir, qwen_dir, dataset, tmp_path):
    sources = [qwen_dir, qwen_dir] if kind == "homogeneous" else [llama_dir, qwen_dir]
    trainer = MAGRPOTrainer(agents=sources, reward_func=length_ratio_reward, train_dataset=dataset, args=_config())
    trainer.train()  # weights must differ from the sources, so the round trip is not trivially equal
    before = AutoModelForCausalLM.from_pretrained(sources[0]).state_dict()
    assert any(not torch.equal(before[k], v) for k, v in trainer.agents[0].state_dict().items())

    out = tmp_path / "run-1"
    trainer.save_model(str(out))
    for i in range(2):
        files = set(os.listdir(out / f"agent_{i}"))
        assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= files
        assert AutoModelForCausalLM.from_pretrained(out / f"agent_{i}").config.model_type == trainer.agents[i].config.model_type

    continued = MAGRPOTrainer(
        agents=[str(out / "agent_0"), str(out / "agent_1")], num_agents=2,
        reward_func=length_ratio_reward, train_dataset=dataset,
        args=MAGRPOConfig(num_agents=2, num_turns=1, num_train_epochs=3, agent_learning_rate=5e-6,
                          temperature=0.7, top_p=0.9, top_k=None),
    )
    for old, new, old_tok, new_tok in zip(trainer.agents, continued.agents, trainer.tokenizers, continued.tokenizers):
        old_state, new_state = old.state_dict(), new.state_dict()
        assert old_state.keys() == new_state.keys()
        assert all(torch.equal(old_state[k], new_state[k]) for k in old_state)
        assert old_tok.get_vocab() == new_tok.get_vocab()
        text = "Write a bedtime story for a dragon:"
        assert old_tok(text).input_ids == new_tok(text).input_ids
        assert (old_tok.eos_token, old_tok.pad_token) == (new_tok.eos_token, new_tok.pad_token)


def test_spec_4_2_continue_from_saved_agents(qwen_dir, dataset, tmp_path):
    first = MAGRPOTrainer(agent_model=qwen_dir, reward_func=length_ratio_reward, train_dataset=dataset, args=_config())
    first.train()
    first.save_model("./saved-models/run-1")
    continued = MAGRPOTrainer(
        agents=["./saved-models/run-1/agent_0", "./saved-models/run-1/agent_1"],
        num_agents=2, reward_func=length_ratio_reward, train_dataset=dataset,
        args=MAGRPOConfig(num_agents=2, num_turns=1, num_train_epochs=3, max_new_tokens=8,
                          agent_learning_rate=5e-6, temperature=0.7, top_p=0.9, top_k=None),
    )
    continued.train()
    assert continued.state.epoch == 3  # three epochs in the new run
    continued.save_model("./saved-models/run-2")
    assert AutoTokenizer.from_pretrained("./saved-models/run-2/agent_1").eos_token == continued.tokenizers[1].eos_token
