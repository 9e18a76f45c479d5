"""The fused temperature/top-k/top-p processor keeps exactly the tokens HF's three warpers keep, and `generate`
samples the same sequences with it as with HF's own warpers under the same seed."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl_hf import MAGRPOConfig
from comlrl_hf.rollout.generation import generate_completions
from comlrl_hf.rollout.sampling import TopKTopPSampler, sampling_kwargs


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.6, 50, 0.6), (1.0, 5, 0.9), (1.7, 200, 0.3), (0.6, 50, 1.0)])
def test_fused_processor_equals_hf_warpers_on_random_logits(temperature, top_k, top_p):
    sampler = TopKTopPSampler(temperature, top_k, top_p)
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        scores = torch.randn(8, 3000, generator=generator) * 4
        fused, reference = sampler(None, scores), sampler.reference(None, scores)
        assert torch.equal(torch.isinf(fused), torch.isinf(reference))
        assert torch.equal(fused, reference)


def test_ties_at_the_top_k_edge_keep_every_tied_token_as_hf_does():
    sampler = TopKTopPSampler(1.0, 3, 1.0)
    scores = torch.tensor([[5.0, 4.0, 3.0, 3.0, 1.0, 0.0], [9.0, 1.0, 2.0, 3.0, 4.0, 0.0]])
    fused = sampler(None, scores)
    assert torch.equal(fused, sampler.reference(None, scores))
    assert torch.isfinite(fused[0]).sum() == 4  # the 3rd and 4th logits tie: both survive top-3


def test_bad_sampling_values_are_refused():
    with pytest.raises(ValueError, match="top_k"):
        TopKTopPSampler(1.0, 0, 0.5)
    with pytest.raises(ValueError, match="top_p"):
        TopKTopPSampler(1.0, 5, 1.5)
    with pytest.raises(ValueError, match="temperature"):
        TopKTopPSampler(0.0, 5, 0.5)


def test_generate_samples_the_same_sequences_as_hf_warpers(llama_dir):
    model = AutoModelForCausalLM.from_pretrained(llama_dir)
    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    args = MAGRPOConfig(output_dir="out", max_new_tokens=12, temperature=0.7, top_k=20, top_p=0.8, report_to=[])
    fused_kwargs = args.generation_kwargs(do_sample=True)
    assert "logits_processor" in fused_kwargs and fused_kwargs["top_k"] == 0  # HF's warpers are switched off
    hf_kwargs = {"max_new_tokens": 12, "do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.8}
    prompts = ["Describe a city in the clouds:", "Design a playground on Mars:"]
    torch.manual_seed(3)
    fused = generate_completions(model, tokenizer, prompts, 4, fused_kwargs)
    torch.manual_seed(3)
    reference = generate_completions(model, tokenizer, prompts, 4, hf_kwargs)
    assert torch.equal(fused.completion_ids, reference.completion_ids)
    assert len(set(fused.completions)) > 1  # it really sampled


def test_no_top_k_uses_hf_warpers():
    assert sampling_kwargs(0.6, None, 0.9) == {"temperature": 0.6, "top_p": 0.9, "top_k": 0}
