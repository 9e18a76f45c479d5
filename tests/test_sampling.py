"""`TopKTopPSampler` keeps exactly the tokens HF's temperature/top-k/top-p warpers keep, draws from the same
distribution, and drives `generate` reproducibly."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl_hf import MAGRPOConfig
from comlrl_hf.rollout.generation import generate_completions
from comlrl_hf.rollout.sampling import TopKTopPSampler, for_model, sampling_kwargs


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.6, 50, 0.6), (1.0, 5, 0.9), (1.7, 200, 0.3), (0.6, 50, 1.0)])
def test_kept_set_and_logits_equal_hf_warpers_on_random_logits(temperature, top_k, top_p):
    sampler = TopKTopPSampler(temperature, top_k, top_p)
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        scores = torch.randn(8, 3000, generator=generator) * 4
        assert torch.equal(sampler.filter(None, scores), sampler.reference(None, scores))


@pytest.mark.parametrize("temperature,top_p", [(0.6, 0.6), (1.0, 1.0)])
def test_bf16_logits_with_ties_at_the_top_k_edge_equal_hf_warpers(temperature, top_p):
    """bf16's coarse grid ties the k-th logit with others in most rows: they all survive, row by row, as in HF."""
    sampler = TopKTopPSampler(temperature, 50, top_p)
    generator = torch.Generator().manual_seed(1)
    scores = (torch.randn(16, 5000, generator=generator) * 3).bfloat16().float()
    values = torch.topk(scores, 51).values
    assert (values[:, 49] == values[:, 50]).sum() >= 4  # the case this test is about
    assert sampler.kept(scores) is not None  # no fallback to the full-vocabulary path
    assert torch.equal(sampler.filter(None, scores), sampler.reference(None, scores))


def test_ties_at_the_top_k_edge_keep_every_tied_token_as_hf_does():
    sampler = TopKTopPSampler(1.0, 3, 1.0)
    scores = torch.tensor([[5.0, 4.0, 3.0, 3.0, 1.0, 0.0], [9.0, 1.0, 2.0, 3.0, 4.0, 0.0]])
    filtered = sampler.filter(None, scores)
    assert torch.equal(filtered, sampler.reference(None, scores))
    assert torch.isfinite(filtered[0]).sum() == 4  # the 3rd and 4th logits tie: both survive top-3
    torch.manual_seed(0)
    draws = torch.stack([sampler(None, scores).argmax(-1) for _ in range(400)])
    assert set(draws[:, 0].tolist()) == {0, 1, 2, 3}  # the tied row is drawn over the whole tie


def test_draws_follow_hf_distribution_and_never_leave_the_kept_set():
    sampler = TopKTopPSampler(0.8, 6, 0.9)
    scores = torch.tensor([[2.0, 1.5, 1.4, 0.3, -0.2, -1.0, -3.0, 4.0, 0.9, -5.0]])
    target = sampler.reference(None, scores).softmax(-1)[0]
    torch.manual_seed(0)
    n = 20000
    out = sampler(None, scores.expand(n, -1).contiguous())
    assert torch.equal((out == 0).sum(-1), torch.ones(n, dtype=torch.long))  # one token per row, argmax = draw
    counts = torch.bincount(out.argmax(-1), minlength=scores.shape[1]).double() / n
    assert torch.all(counts[target == 0] == 0)
    assert torch.allclose(counts, target.double(), atol=0.015), (counts, target)


def test_bad_sampling_values_are_refused():
    with pytest.raises(ValueError, match="top_k"):
        TopKTopPSampler(1.0, 0, 0.5)
    with pytest.raises(ValueError, match="top_p"):
        TopKTopPSampler(1.0, 5, 1.5)
    with pytest.raises(ValueError, match="temperature"):
        TopKTopPSampler(0.0, 5, 0.5)


def test_generate_with_the_sampler_is_seeded_and_top_1_is_greedy(llama_dir):
    model = AutoModelForCausalLM.from_pretrained(llama_dir)
    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    prompts = ["Describe a city in the clouds:", "Design a playground on Mars:"]
    args = MAGRPOConfig(output_dir="out", max_new_tokens=12, temperature=0.7, top_k=20, top_p=0.8, report_to=[])
    kwargs = args.generation_kwargs(do_sample=True)
    assert "logits_processor" in kwargs and kwargs["do_sample"] is False  # the sampler draws, generate is greedy
    runs = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        runs.append(generate_completions(model, tokenizer, prompts, 4, kwargs).completion_ids)
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])
    assert len({tuple(row) for row in runs[0].tolist()}) > 1  # it really sampled
    top1 = MAGRPOConfig(output_dir="out", max_new_tokens=12, top_k=1, report_to=[]).generation_kwargs(do_sample=True)
    greedy = generate_completions(model, tokenizer, prompts, 1, {"max_new_tokens": 12, "do_sample": False})
    assert torch.equal(generate_completions(model, tokenizer, prompts, 1, top1).completion_ids, greedy.completion_ids)


def test_a_model_generation_config_with_sampling_only_settings_keeps_hf_sampling(llama_dir):
    model = AutoModelForCausalLM.from_pretrained(llama_dir)
    kwargs = MAGRPOConfig(output_dir="out", max_new_tokens=4, report_to=[]).generation_kwargs(do_sample=True)
    assert for_model(model, kwargs) is kwargs  # nothing sampling-only configured: the sampler
    model.generation_config.min_p = 0.05  # applied by transformers only when do_sample=True
    adapted = for_model(model, kwargs)
    assert adapted["do_sample"] is True and "logits_processor" not in adapted
    assert (adapted["temperature"], adapted["top_k"], adapted["top_p"]) == (0.6, 50, 0.6)


def test_no_top_k_uses_hf_sampling():
    assert sampling_kwargs(0.6, None, 0.9) == {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 0}
