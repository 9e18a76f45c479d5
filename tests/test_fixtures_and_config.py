import time

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser

from comlrl_hf import MAGRPOConfig, MultiAgentConfig
from comlrl_hf.testing import build_tiny_model, build_tokenizer, save_tiny_model


def test_tiny_models_build_fast_and_reload(tmp_path):
    start = time.perf_counter()
    for arch in ("llama", "qwen2"):
        path = save_tiny_model(tmp_path / arch, arch)
        tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
        assert model.config.model_type == arch
        assert model.get_input_embeddings().num_embeddings == len(tok)
        text = "Design a playground on Mars:"
        assert tok(text).input_ids == build_tokenizer("unigram" if arch == "llama" else "bpe")(text).input_ids
    assert time.perf_counter() - start < 10  # generous: the point is "no download"


def test_two_tokenizers_have_different_vocabularies():
    bpe, unigram = build_tokenizer("bpe"), build_tokenizer("unigram")
    assert bpe.get_vocab() != unigram.get_vocab()
    assert bpe("Describe a city").input_ids != unigram("Describe a city").input_ids
    with pytest.raises(ValueError, match="tokenizer_kind"):
        build_tokenizer("wordpiece")
    with pytest.raises(ValueError, match="arch"):
        build_tiny_model("gpt9")


def test_config_defaults_and_learning_rate_alias():
    config = MultiAgentConfig()  # no output_dir needed
    assert config.output_dir and config.agent_learning_rate == config.learning_rate == 5e-6
    assert config.lr_scheduler_type == "constant" and config.save_strategy == "no"
    assert config.train_batch_size == config.per_device_train_batch_size  # the Trainer property still works
    assert MultiAgentConfig(learning_rate=1e-4).agent_learning_rate == 1e-4
    assert MultiAgentConfig(agent_learning_rate=2e-4).learning_rate == 2e-4
    with pytest.raises(ValueError, match=r"learning_rate=0.001 and agent_learning_rate=0.0001"):
        MultiAgentConfig(learning_rate=1e-3, agent_learning_rate=1e-4)


def test_config_works_with_hf_argument_parser():
    (config,) = HfArgumentParser(MAGRPOConfig).parse_args_into_dataclasses(
        ["--num_agents", "3", "--top_k", "5", "--advantage_mode", "rloo", "--agent_learning_rate", "1e-4"]
    )
    assert (config.num_agents, config.top_k, config.advantage_mode, config.learning_rate) == (3, 5, "rloo", 1e-4)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_generations=1), "num_generations must be >= 2.*got 1"),
        (dict(temperature=0), "temperature.*got 0"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\], got 1.5"),
        (dict(top_k=-1), "top_k.*got -1"),
        (dict(max_new_tokens=0), "max_new_tokens.*got 0"),
        (dict(min_new_tokens=9, max_new_tokens=8), "min_new_tokens=9 exceeds max_new_tokens=8"),
        (dict(num_agents=0), "num_agents.*got 0"),
        (dict(advantage_mode="median"), "advantage_mode.*'median'"),
        (dict(scale_rewards="yes"), "scale_rewards.*'yes'"),
        (dict(loss_type="ppo"), "loss_type.*'ppo'"),
        (dict(num_ppo_epochs=0), "num_ppo_epochs.*0"),
        (dict(beta=-1.0), "beta must be >= 0, got -1.0"),
    ],
)
def test_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MAGRPOConfig(**kwargs)
