"""Advantage and loss functions against hand-computed values."""

import math

import pytest
import torch

from comlrl_hf import MAGRPOConfig, MAREINFORCEConfig, MAReMaxConfig, MARLOOConfig
from comlrl_hf.rollout.generation import completion_mask_from_eos
from comlrl_hf.utils.advantages import group_advantages
from comlrl_hf.utils.losses import policy_loss
from comlrl_hf.utils.preference import bradley_terry_loss, select_pairs

R = torch.tensor([[1.0, 2.0, 3.0, 6.0]])  # mean 3, max 6, sample std sqrt(14/3)
STD = math.sqrt(14 / 3)


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("mean", [-2.0, -1.0, 0.0, 3.0]),
        ("raw", [1.0, 2.0, 3.0, 6.0]),
        ("max", [-5.0, -4.0, -3.0, 0.0]),
        # leave-one-out baselines: (11/3, 10/3, 3, 2)
        ("rloo", [1 - 11 / 3, 2 - 10 / 3, 0.0, 4.0]),
    ],
)
def test_baselines_by_hand(mode, expected):
    assert torch.allclose(group_advantages(R, mode, "none"), torch.tensor([expected]), atol=1e-6)
    scaled = group_advantages(R, mode, "group", eps=0.0)
    assert torch.allclose(scaled, torch.tensor([expected]) / STD, atol=1e-6)


def test_batch_scaling_uses_all_rewards():
    rewards = torch.tensor([[0.0, 2.0], [4.0, 6.0]])
    std = torch.tensor([0.0, 2.0, 4.0, 6.0]).std()
    assert torch.allclose(group_advantages(rewards, "mean", "batch", eps=0.0), torch.tensor([[-1.0, 1.0], [-1.0, 1.0]]) / std)


def test_identical_rewards_give_zero_advantage_not_nan():
    assert torch.equal(group_advantages(torch.ones(2, 4), "mean", "group"), torch.zeros(2, 4))


def test_variants_produce_different_advantages_on_the_same_rewards():
    """The original z-normalises after the baseline, which makes all four identical (comlrl-anchor A.5)."""
    results = {}
    for config_cls in (MAGRPOConfig, MAREINFORCEConfig, MARLOOConfig, MAReMaxConfig):
        config = config_cls()
        results[config_cls.__name__] = group_advantages(R, config.advantage_mode, config.scale_rewards)
    values = list(results.values())
    for i in range(len(values)):
        for j in range(i + 1, len(values)):
            assert not torch.allclose(values[i], values[j]), (list(results)[i], list(results)[j])
    # and under one shared scaling too
    same_scale = [group_advantages(R, mode, "group") for mode in ("mean", "raw", "max", "rloo")]
    assert all(not torch.allclose(a, b) for k, a in enumerate(same_scale) for b in same_scale[k + 1:])


def test_completion_mask_stops_after_first_eos():
    eos, pad = 2, 0
    ids = torch.tensor([[5, 6, eos, pad, pad], [5, eos, eos, eos, eos], [5, 6, 7, 8, 9]])
    expected = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    assert torch.equal(completion_mask_from_eos(ids, eos), expected)  # pad == eos handled too (row 2)
    assert torch.equal(completion_mask_from_eos(ids, [eos, 9]), expected)


def test_policy_loss_on_policy_by_hand():
    """ratio = 1: loss = -mean_i( mean_t A_i ) over masked tokens; padding after EOS never counts."""
    logps = torch.tensor([[-1.0, -2.0, -50.0], [-0.5, -0.5, -0.5]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([2.0, -1.0])
    loss, stats = policy_loss(logps, logps.detach(), adv, mask, loss_type="grpo")
    assert loss.item() == pytest.approx(-(2.0 + -1.0) / 2)
    loss.backward()
    # d loss / d logp_{i,t} = -A_i / (|mask_i| * num_sequences); zero on padding
    expected = torch.tensor([[-2.0 / 4, -2.0 / 4, 0.0], [1.0 / 6, 1.0 / 6, 1.0 / 6]])
    assert torch.allclose(logps.grad, expected)
    assert stats["clip_ratio"].item() == 0.0


def test_policy_loss_normalisations():
    logps = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([2.0, -1.0])
    dapo, _ = policy_loss(logps, logps, adv, mask, loss_type="dapo")
    assert dapo.item() == pytest.approx(-(2 * 2 + -1 * 3) / 5)
    dr, _ = policy_loss(logps, logps, adv, mask, loss_type="dr_grpo", max_completion_length=4)
    assert dr.item() == pytest.approx(-(2 * 2 + -1 * 3) / (2 * 4))


def test_policy_loss_clips_the_ratio():
    old = torch.zeros(1, 2)
    logps = torch.log(torch.tensor([[1.5, 0.9]]))  # ratios 1.5 (clipped to 1.2) and 0.9
    loss, stats = policy_loss(logps, old, torch.tensor([1.0]), torch.ones(1, 2), epsilon_low=0.2)
    # -min(r*A, clip(r)*A) = -(1.2, 0.9), mean = -1.05
    assert loss.item() == pytest.approx(-1.05)
    assert stats["clip_ratio"].item() == pytest.approx(0.5)
    loss_high, _ = policy_loss(logps, old, torch.tensor([1.0]), torch.ones(1, 2), epsilon_low=0.2, epsilon_high=0.6)
    assert loss_high.item() == pytest.approx(-(1.5 + 0.9) / 2)


def test_policy_loss_k3_kl():
    logps = torch.zeros(1, 2)
    ref = torch.tensor([[0.0, math.log(2.0)]])  # delta = ln 2 -> kl = 2 - ln2 - 1
    loss, stats = policy_loss(logps, logps, torch.tensor([0.0]), torch.ones(1, 2), ref_logps=ref, beta=0.5)
    kl = 1 - math.log(2.0)
    assert stats["kl"].item() == pytest.approx(kl / 2)
    assert loss.item() == pytest.approx(0.5 * kl / 2)
    with pytest.raises(ValueError, match="needs ref_logps"):
        policy_loss(logps, logps, torch.tensor([0.0]), torch.ones(1, 2), beta=0.5)


def test_zero_variance_groups_are_not_blown_up():
    rewards = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 1.0]])
    for mode in ("raw", "max", "mean", "rloo"):
        advantages = group_advantages(rewards, mode, "group")
        assert advantages.abs().max() < 10, (mode, advantages)
    assert torch.equal(group_advantages(rewards, "raw", "group")[0], torch.ones(4))  # left unscaled


def test_logits_to_keep_gives_the_same_log_probs():
    from comlrl_hf.testing import build_tiny_model, build_tokenizer
    from comlrl_hf.utils.logprobs import completion_logps

    tok = build_tokenizer("bpe")
    model = build_tiny_model("qwen2", tok).eval()
    enc = tok(["Describe a city in the clouds: once upon", "hi"], return_tensors="pt", padding=True, padding_side="left")
    completion = torch.randint(3, 300, (2, 5), generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    full, _ = completion_logps(model, enc.input_ids, enc.attention_mask, completion, mask, temperature=0.7)
    kept, _ = completion_logps(model, enc.input_ids, enc.attention_mask, completion, mask, temperature=0.7,
                               keep_logits_only_for_completion=True)
    assert torch.equal(full, kept)


# ---- preference learning ----


def test_pairs_by_reward_gap_drop_ties_and_order_by_gap():
    rewards = [0.5, 0.1, 0.5, 0.9]
    everything = select_pairs(rewards, "all", None)
    assert set(everything) == {(0, 1), (2, 1), (3, 0), (3, 1), (3, 2)}  # (0, 2) and (2, 0) tie
    assert select_pairs(rewards, "reward_gap", 3) == [(3, 1), (0, 1), (2, 1)]  # gaps .8, .4, .4 (index order)
    assert select_pairs([1.0, 1.0, 1.0], "reward_gap", 4) == []


def test_random_pairs_are_a_seeded_subset():
    rewards = [0.0, 1.0, 2.0, 3.0, 4.0]
    picks = [select_pairs(rewards, "random", 4, torch.Generator().manual_seed(s)) for s in (0, 0, 1)]
    assert picks[0] == picks[1] != picks[2]
    assert len(picks[0]) == 4 and all(rewards[w] > rewards[l] for w, l in picks[0])
    with pytest.raises(ValueError, match="pair_selection must be one of"):
        select_pairs(rewards, "best", 1)


def test_bradley_terry_loss_by_hand():
    chosen, rejected = torch.tensor([2.0, 0.0, -1.0]), torch.tensor([0.0, 1.0, -1.0])
    loss, accuracy = bradley_terry_loss(chosen, rejected)
    margins = [2.0, -1.0, 0.0]
    expected = sum(math.log(1 + math.exp(-m)) for m in margins) / 3
    assert loss.item() == pytest.approx(expected) and accuracy.item() == pytest.approx(1 / 3)
