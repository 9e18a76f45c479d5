"""Every constructor example of the spec (§1.1, §1.2, §4.2, §6 models) builds; every mismatch raises early."""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl_hf import MAGRPOConfig, MAGRPOTrainer, MultiAgentConfig
from comlrl_hf.testing import build_tokenizer

from conftest import length_ratio_reward


def reward3(c1, c2, c3):
    return [float(len(a) + len(b) + len(c)) for a, b, c in zip(c1, c2, c3)]


def test_spec_1_1_homogeneous(llama_dir, dataset):
    trainer = MAGRPOTrainer(
        agent_model=llama_dir, agents=None, num_agents=3,
        reward_func=reward3, train_dataset=dataset,
        args=MAGRPOConfig(num_agents=3, num_turns=1, temperature=0.7, top_p=0.9, top_k=None),
    )
    assert trainer.num_agents == 3 and len(trainer.agents) == 3
    # independent copies, one tokenizer loaded once and shared
    assert trainer.agents[0] is not trainer.agents[1]
    assert trainer.agents[0].model.embed_tokens.weight.data_ptr() != trainer.agents[1].model.embed_tokens.weight.data_ptr()
    assert trainer.tokenizers[0] is trainer.tokenizers[2]


def test_spec_1_2_heterogeneous_ids_load_their_own_tokenizers(llama_dir, qwen_dir, dataset):
    trainer = MAGRPOTrainer(
        agent_model=None, agents=[llama_dir, qwen_dir],
        reward_func=length_ratio_reward, train_dataset=dataset,
        args=MAGRPOConfig(num_agents=2, num_turns=1, temperature=0.7, top_p=0.9, top_k=None),
    )
    assert [a.config.model_type for a in trainer.agents] == ["llama", "qwen2"]
    assert trainer.tokenizers[0].get_vocab() != trainer.tokenizers[1].get_vocab()
    assert trainer.args.num_agents == 2


def test_spec_6_model_objects_with_a_shared_tokenizer(qwen_dir, dataset):
    tokenizer = AutoTokenizer.from_pretrained(qwen_dir)
    config = MAGRPOConfig(num_turns=1, num_train_epochs=2, num_generations=4, max_new_tokens=64, logging_steps=1)
    trainer = MAGRPOTrainer(
        agents=[AutoModelForCausalLM.from_pretrained(qwen_dir) for _ in range(2)],
        tokenizer=tokenizer, reward_func=length_ratio_reward, train_dataset=dataset, args=config,
    )
    assert trainer.num_agents == 2 and trainer.tokenizers == [tokenizer, tokenizer]


def test_agent_model_and_matching_agents_list(llama_dir, dataset):
    trainer = MAGRPOTrainer(
        agent_model=llama_dir, agents=[llama_dir, llama_dir], reward_func=length_ratio_reward,
        train_dataset=dataset, args=MAGRPOConfig(),
    )
    assert trainer.num_agents == 2


def test_missing_pad_token_falls_back_to_eos(qwen_dir, dataset):
    tok = AutoTokenizer.from_pretrained(qwen_dir)
    tok.pad_token = None
    trainer = MAGRPOTrainer(agents=[qwen_dir, qwen_dir], tokenizer=tok, reward_func=length_ratio_reward,
                            train_dataset=dataset, args=MAGRPOConfig())
    assert trainer.tokenizers[0].pad_token_id == tok.eos_token_id


def _no_eos_tokenizer():
    tok = build_tokenizer("bpe")
    tok.eos_token = None
    return tok


def _big_tokenizer():
    tok = build_tokenizer("bpe")
    tok.add_tokens([f"extra_token_{i}" for i in range(50)])
    return tok


def _conflicts(llama_dir, qwen_dir):
    model = AutoModelForCausalLM.from_pretrained(qwen_dir)
    unnamed = copy.deepcopy(model)
    unnamed.config._name_or_path = ""
    unnamed.name_or_path = ""
    return [
        ("neither", dict(), "either agent_model or agents must be provided"),
        ("names differ", dict(agent_model=llama_dir, agents=[llama_dir, qwen_dir]),
         f"agent_model='{llama_dir}' conflicts with agents\\[1\\]='{qwen_dir}'"),
        ("list vs num_agents", dict(agents=[llama_dir] * 3, num_agents=2), "agents has 3 entries but num_agents is 2"),
        ("list vs config", dict(agents=[llama_dir] * 3, args=MAGRPOConfig(num_agents=2)),
         "agents has 3 entries but num_agents is 2"),
        ("config vs argument", dict(agent_model=llama_dir, num_agents=3, args=MAGRPOConfig(num_agents=2)),
         r"num_agents=3 \(trainer argument\) disagrees with args.num_agents=2"),
        ("objects without tokenizer", dict(agents=[model, unnamed]),
         r"tokenizer must be provided when agents are model objects \(agents\[0\] is a Qwen2ForCausalLM\)"),
        ("tokenizer list length", dict(agents=[llama_dir, qwen_dir], tokenizer=[build_tokenizer()] * 3),
         "tokenizer list has 3 entries but there are 2 agents"),
        ("tokenizer without eos", dict(agents=[qwen_dir, qwen_dir], tokenizer=_no_eos_tokenizer()),
         r"tokenizer for agents\[0\] .* has no eos_token"),
        ("tokenizer too big for model", dict(agents=[qwen_dir, qwen_dir], tokenizer=_big_tokenizer()),
         r"tokenizer for agents\[0\] has 434 tokens but the model's embedding table has 384 rows"),
        ("loaded shortcut for 2 agents", dict(agent_model=model), "agent_model is a loaded Qwen2ForCausalLM"),
        ("None entry", dict(agents=[llama_dir, None]), r"agents\[1\] is None"),
        ("agents is a string", dict(agents=llama_dir), "agents must be a list"),
        ("same object twice", dict(agents=[model, model], tokenizer=build_tokenizer("bpe")),
         r"agents\[1\] is the same model object"),
        ("unnamed object vs shortcut", dict(agent_model=qwen_dir, agents=[model, unnamed], tokenizer=build_tokenizer("bpe")),
         r"cannot check agents\[1\] against agent_model"),
        ("wrong config class", dict(agent_model=llama_dir, args=MultiAgentConfig()),
         "MAGRPOTrainer needs args of type MAGRPOConfig, got MultiAgentConfig"),
        ("unknown model_config key", dict(agent_model=llama_dir, model_config={"dtyp": "float32"}),
         r"model_config has unknown keys \['dtyp'\]"),
        ("reward arity", dict(agent_model=llama_dir, reward_func=lambda c1: [0.0] * len(c1)),
         "takes 1 positional completion list.* but there are 2 agents"),
        ("reward not callable", dict(agent_model=llama_dir, reward_func=[1.0]), "reward_func must be callable, got list"),
        ("formatters length", dict(agent_model=llama_dir, formatters=[str, str, str]),
         "formatters has 3 entries but there are 2 agents"),
        ("multi-turn without transition", dict(agent_model=llama_dir, args=MAGRPOConfig(num_turns=2)),
         "num_turns=2 needs an external_transition"),
    ]


def test_every_mismatch_raises_at_construction(llama_dir, qwen_dir, dataset):
    for name, kwargs, message in _conflicts(llama_dir, qwen_dir):
        kwargs = {"reward_func": length_ratio_reward, "train_dataset": dataset, **kwargs}
        kwargs.setdefault("args", MAGRPOConfig())
        with pytest.raises(ValueError, match=message):
            MAGRPOTrainer(**kwargs)
            pytest.fail(f"{name}: no error")


def test_model_config_dtype_is_applied(llama_dir, dataset):
    trainer = MAGRPOTrainer(agent_model=llama_dir, model_config={"dtype": "bfloat16"},
                            reward_func=length_ratio_reward, train_dataset=dataset, args=MAGRPOConfig())
    assert all(a.dtype == torch.bfloat16 for a in trainer.agents)
