"""Property-based tests (hypothesis) of the pure advantage, return, loss and pair-selection functions:
invariances under shifts and scales of the rewards, permutations of samples and groups, and masking.
The hand-computed examples live in test_math.py / test_multiturn.py; these check the laws on random input."""

import math

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from comlrl_hf.rollout.multiturn import credit_to_agents, discounted_returns, joint_actions
from comlrl_hf.utils.advantages import ADVANTAGE_MODES, SCALE_REWARDS, group_advantages, tree_gae
from comlrl_hf.utils.losses import LOSS_TYPES, policy_loss
from comlrl_hf.utils.preference import bradley_terry_loss, select_pairs

FAST = settings(max_examples=60, deadline=None)
reward = st.floats(-10, 10, allow_nan=False, allow_infinity=False, width=64)


@st.composite
def reward_tables(draw, min_k=2):
    b, k = draw(st.integers(1, 4)), draw(st.integers(min_k, 6))
    values = draw(st.lists(reward, min_size=b * k, max_size=b * k))
    return torch.tensor(values, dtype=torch.float64).view(b, k)


def _stds(rewards: torch.Tensor) -> list[float]:
    return rewards.std(dim=1).tolist() + [rewards.std().item()]


def _away_from(stds, eps, margin=1e-6):
    # The scale switches off below eps: keep examples clear of that edge, where rounding decides.
    return all(abs(s - eps) > margin for s in stds)


@FAST
@given(reward_tables(), st.floats(-100, 100, width=64), st.sampled_from(("mean", "rloo", "max")),
       st.sampled_from(SCALE_REWARDS))
def test_a_reward_shift_leaves_relative_baselines_unchanged(rewards, shift, mode, scale):
    assume(_away_from(_stds(rewards), 1e-4) and _away_from(_stds(rewards + shift), 1e-4))
    before = group_advantages(rewards, mode, scale)
    after = group_advantages(rewards + shift, mode, scale)
    assert torch.allclose(before, after, atol=1e-9)


@FAST
@given(reward_tables(), st.floats(-100, 100, width=64), st.sampled_from(("group", "none")))
def test_a_shift_moves_raw_advantages_by_the_shift(rewards, shift, scale):
    # the "raw" baseline is 0, so it is *not* shift invariant: unscaled advantages move by exactly the shift
    assume(scale == "none" or all(s > 1e-3 for s in _stds(rewards)))
    moved = group_advantages(rewards + shift, "raw", scale) - group_advantages(rewards, "raw", scale)
    expected = shift / (rewards.std(dim=1, keepdim=True) + 1e-4) if scale == "group" else torch.full_like(rewards, shift)
    assert torch.allclose(moved, expected.expand_as(rewards), atol=1e-8)


@FAST
@given(reward_tables(), st.floats(0.01, 100, width=64), st.sampled_from(ADVANTAGE_MODES))
def test_positive_scaling_scales_unscaled_and_leaves_std_scaled_advantages(rewards, factor, mode):
    scaled = rewards * factor
    assert torch.allclose(group_advantages(scaled, mode, "none"), factor * group_advantages(rewards, mode, "none"),
                          rtol=1e-9, atol=1e-9)
    # Divided by the group's (or batch's) standard deviation the scale cancels, wherever that deviation is not ~0.
    for scale in ("group", "batch"):
        assume(all(s > 1e-6 for s in _stds(rewards) + _stds(scaled)))
        a = group_advantages(rewards, mode, scale, eps=0.0)
        b = group_advantages(scaled, mode, scale, eps=0.0)
        assert torch.allclose(a, b, rtol=1e-7, atol=1e-9)


@FAST
@given(reward_tables(), st.sampled_from(ADVANTAGE_MODES), st.sampled_from(SCALE_REWARDS), st.randoms())
def test_permuting_samples_permutes_advantages(rewards, mode, scale, rng):
    b, k = rewards.shape
    index = torch.stack([torch.tensor(rng.sample(range(k), k)) for _ in range(b)])  # one permutation per group
    shuffled = torch.gather(rewards, 1, index)
    expected = torch.gather(group_advantages(rewards, mode, scale), 1, index)
    assert torch.allclose(group_advantages(shuffled, mode, scale), expected, atol=1e-9)


@FAST
@given(reward_tables(), st.sampled_from(ADVANTAGE_MODES), st.sampled_from(SCALE_REWARDS), st.randoms())
def test_permuting_groups_permutes_rows(rewards, mode, scale, rng):
    order = torch.tensor(rng.sample(range(rewards.shape[0]), rewards.shape[0]))
    assert torch.allclose(group_advantages(rewards[order], mode, scale), group_advantages(rewards, mode, scale)[order],
                          atol=1e-9)


@FAST
@given(reward_tables(), st.sampled_from(("group", "batch")))
def test_mean_and_rloo_advantages_sum_to_zero_per_group(rewards, scale):
    for mode in ("mean", "rloo"):
        assert torch.allclose(group_advantages(rewards, mode, scale).sum(dim=1), torch.zeros(rewards.shape[0],
                              dtype=rewards.dtype), atol=1e-8)
    assert (group_advantages(rewards, "max", scale) <= 1e-12).all()  # nothing beats the best sample


# ---- multi-turn returns ----

@st.composite
def trees(draw):
    """rewards[t]: [nodes_t, J]; children[t][n]: child node per joint action or None (a leaf: early stop)."""
    turns, width, roots = draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    rewards, children, nodes = [], [], roots
    for t in range(turns):
        rewards.append(torch.tensor(draw(st.lists(reward, min_size=nodes * width, max_size=nodes * width)),
                                    dtype=torch.float64).view(nodes, width))
        if t == turns - 1:
            children.append([None] * nodes)
            break
        kids, count = [], 0
        for _ in range(nodes):
            if draw(st.booleans()) or t == 0:  # expand (the roots always continue, so depth is real)
                kids.append(list(range(count, count + width)))
                count += width
            else:
                kids.append(None)
        children.append(kids)
        if count == 0:
            break
        nodes = count
    return rewards, children


@FAST
@given(trees())
def test_discount_zero_returns_the_rewards(tree):
    rewards, children = tree
    for got, r in zip(discounted_returns(rewards, children, 0.0), rewards):
        assert torch.equal(got, r)


@FAST
@given(st.lists(reward, min_size=1, max_size=6), st.floats(0, 1, width=64))
def test_a_single_path_sums_discounted_rewards(path, gamma):
    rewards = [torch.tensor([[r]], dtype=torch.float64) for r in path]
    children = [[[0]] for _ in path[:-1]] + [[None]]
    returns = discounted_returns(rewards, children, gamma)
    for t in range(len(path)):
        expected = sum(gamma ** (u - t) * path[u] for u in range(t, len(path)))
        assert math.isclose(returns[t].item(), expected, rel_tol=1e-9, abs_tol=1e-9)
    if gamma == 1.0:
        assert math.isclose(returns[0].item(), sum(path), rel_tol=1e-9, abs_tol=1e-9)


@FAST
@given(trees(), st.floats(-5, 5, width=64), st.floats(0.01, 10, width=64), st.floats(0, 1, width=64))
def test_returns_are_affine_in_the_rewards(tree, shift, factor, gamma):
    rewards, children = tree
    base = discounted_returns(rewards, children, gamma)
    scaled = discounted_returns([factor * r for r in rewards], children, gamma)
    for a, b in zip(base, scaled):
        assert torch.allclose(factor * a, b, rtol=1e-9, atol=1e-8)
    # a constant added to every reward adds the discounted number of remaining turns on each path
    shifted = discounted_returns([r + shift for r in rewards], children, gamma)
    constant = discounted_returns([torch.full_like(r, shift) for r in rewards], children, gamma)
    for a, b, c in zip(base, shifted, constant):
        assert torch.allclose(a + c, b, atol=1e-8)


@FAST
@given(st.lists(reward, min_size=1, max_size=30), st.integers(1, 3), st.integers(1, 3), st.sampled_from(("aligned", "cross")))
def test_credit_keeps_each_agents_mean_return(values, k, n, mode):
    actions = joint_actions(k, n, mode)
    returns = torch.tensor((values * len(actions))[: len(actions)], dtype=torch.float64)
    credit = credit_to_agents(returns, actions, k)
    assert credit.shape == (n, k)
    # every completion sits in the same number of joint actions, so each agent's mean credit is the mean return
    assert torch.allclose(credit.mean(dim=1), returns.mean().expand(n), atol=1e-9)
    if mode == "aligned":
        assert torch.allclose(credit, returns.expand(n, k))


@st.composite
def gae_trees(draw):
    turns = draw(st.integers(1, 4))
    sizes = [draw(st.integers(1, 4)) for _ in range(turns)]
    rewards = [torch.tensor(draw(st.lists(reward, min_size=s, max_size=s)), dtype=torch.float64) for s in sizes]
    values = [torch.tensor(draw(st.lists(reward, min_size=s, max_size=s)), dtype=torch.float64) for s in sizes]
    next_row = [[draw(st.one_of(st.none(), st.integers(0, sizes[t + 1] - 1))) for _ in range(sizes[t])]
                for t in range(turns - 1)] + [[None] * sizes[-1]]
    return rewards, values, next_row


def _path_return(rewards, next_row, t, n, gamma):
    total, discount = 0.0, 1.0
    while n is not None:
        total += discount * rewards[t][n].item()
        discount *= gamma
        n, t = next_row[t][n], t + 1
    return total


@FAST
@given(gae_trees(), st.floats(0, 1, width=64))
def test_gae_lambda_one_targets_are_monte_carlo_returns_whatever_the_values(tree, gamma):
    rewards, values, next_row = tree
    _, targets = tree_gae(rewards, values, next_row, gamma, 1.0)
    _, other = tree_gae(rewards, [v * 3 - 1 for v in values], next_row, gamma, 1.0)
    for t, (row, again) in enumerate(zip(targets, other)):
        for n in range(len(row)):
            expected = _path_return(rewards, next_row, t, n, gamma)
            assert math.isclose(row[n].item(), expected, rel_tol=1e-9, abs_tol=1e-8)
            assert math.isclose(again[n].item(), expected, rel_tol=1e-9, abs_tol=1e-8)


@FAST
@given(gae_trees(), st.floats(0, 1, width=64))
def test_gae_lambda_zero_is_the_one_step_td_error(tree, gamma):
    rewards, values, next_row = tree
    advantages, targets = tree_gae(rewards, values, next_row, gamma, 0.0)
    for t in range(len(rewards)):
        for n, child in enumerate(next_row[t]):
            bootstrap = values[t + 1][child].item() if child is not None else 0.0
            assert math.isclose(advantages[t][n].item(), rewards[t][n].item() + gamma * bootstrap - values[t][n].item(),
                                rel_tol=1e-9, abs_tol=1e-8)
            assert math.isclose(targets[t][n].item(), advantages[t][n].item() + values[t][n].item(), abs_tol=1e-8)


# ---- the policy loss ----

logp = st.floats(-6, 0, width=64)


@st.composite
def loss_inputs(draw):
    rows, length = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    cells = rows * length

    def table(strategy):
        return torch.tensor(draw(st.lists(strategy, min_size=cells, max_size=cells)), dtype=torch.float64).view(rows, length)

    mask = table(st.sampled_from([0.0, 1.0]))
    return dict(logps=table(logp), old_logps=table(logp), ref_logps=table(logp), mask=mask,
                advantages=torch.tensor(draw(st.lists(reward, min_size=rows, max_size=rows)), dtype=torch.float64),
                noise=(table(logp), table(logp), table(logp)))


@FAST
@given(loss_inputs(), st.sampled_from(LOSS_TYPES), st.sampled_from([0.0, 0.3]), st.sampled_from([0.2, 0.5]))
def test_masked_tokens_change_neither_loss_nor_gradients(x, loss_type, beta, epsilon):
    hidden = x["mask"] == 0

    def run(logps, old, ref):
        logps = logps.clone().requires_grad_(True)
        loss, stats = policy_loss(logps, old, x["advantages"], x["mask"], epsilon_low=epsilon, loss_type=loss_type,
                                  ref_logps=ref, beta=beta, max_completion_length=logps.shape[1])
        loss.backward()
        return loss.detach(), logps.grad, stats

    loss, grad, stats = run(x["logps"], x["old_logps"], x["ref_logps"])
    # overwrite every masked token of the current, sampling and reference log-probs with other values
    other = [torch.where(hidden, noise, value) for noise, value in zip(x["noise"], (x["logps"], x["old_logps"], x["ref_logps"]))]
    loss2, grad2, stats2 = run(*other)
    assert torch.allclose(loss, loss2, atol=1e-12)
    assert torch.allclose(grad, grad2, atol=1e-12)
    assert torch.all(grad[hidden] == 0)
    assert torch.allclose(stats["clip_ratio"], stats2["clip_ratio"])
    if beta:
        assert torch.allclose(stats["kl"], stats2["kl"], atol=1e-12)


@FAST
@given(loss_inputs())
def test_on_policy_gradient_is_minus_the_advantage_per_token(x):
    # old = current (num_ppo_epochs=1): the "grpo" gradient of token t of row i is -A_i / (R * tokens_i)
    logps = x["logps"].clone().requires_grad_(True)
    loss, _ = policy_loss(logps, logps.detach(), x["advantages"], x["mask"])
    loss.backward()
    tokens = x["mask"].sum(dim=1, keepdim=True).clamp(min=1)
    expected = -x["advantages"].unsqueeze(1) * x["mask"] / (tokens * logps.shape[0])
    assert torch.allclose(logps.grad, expected, atol=1e-12)


# ---- preferences ----

scores = st.lists(st.floats(-20, 20, width=32), min_size=1, max_size=16)


@FAST
@given(scores, st.data())
def test_bradley_terry_swap_is_antisymmetric(chosen, data):
    rejected = data.draw(st.lists(st.floats(-20, 20, width=32), min_size=len(chosen), max_size=len(chosen)))
    c, r = torch.tensor(chosen), torch.tensor(rejected)
    assume(bool((c != r).all()))  # ties count as wrong both ways
    loss, accuracy = bradley_terry_loss(c, r)
    swapped_loss, swapped_accuracy = bradley_terry_loss(r, c)
    assert math.isclose(accuracy.item() + swapped_accuracy.item(), 1.0, abs_tol=1e-6)
    # -log s(m) + log s(-m) = -m, so the two losses differ by the mean margin
    assert math.isclose(loss.item() - swapped_loss.item(), -(c - r).mean().item(), rel_tol=1e-4, abs_tol=1e-4)
    assert loss.item() >= 0 and swapped_loss.item() >= 0


@FAST
@given(scores, st.floats(0, 10, width=32))
def test_bradley_terry_loss_falls_as_the_margin_grows(margins, extra):
    m = torch.tensor(margins)
    zero = torch.zeros_like(m)
    loss, _ = bradley_terry_loss(m, zero)
    wider, accuracy = bradley_terry_loss(m + extra, zero)
    assert wider.item() <= loss.item() + 1e-6
    if extra > 0.5:
        assert wider.item() < loss.item()
    assert accuracy.item() == ((m + extra) > 0).float().mean().item()


@FAST
@given(st.lists(st.integers(-3, 3).map(float), min_size=0, max_size=8), st.sampled_from(("reward_gap", "random", "all")),
       st.one_of(st.none(), st.integers(1, 10)), st.integers(0, 2**31 - 1))
def test_selected_pairs_are_strictly_ordered_distinct_and_counted(rewards, selection, count, seed):
    count = None if selection == "all" else (count or 1)
    generator = torch.Generator().manual_seed(seed)
    pairs = select_pairs(rewards, selection, count, generator)
    ordered = {(w, l) for w in range(len(rewards)) for l in range(len(rewards)) if rewards[w] > rewards[l]}
    assert all(rewards[w] > rewards[l] for w, l in pairs)  # no ties, winner first
    assert len(set(pairs)) == len(pairs) and set(pairs) <= ordered
    assert len(pairs) == (len(ordered) if count is None else min(count, len(ordered)))
    if selection == "reward_gap":
        gaps = [rewards[w] - rewards[l] for w, l in pairs]
        assert gaps == sorted(gaps, reverse=True)
        assert not ordered or gaps[0] == max(rewards[w] - rewards[l] for w, l in ordered)
    if selection == "random":
        assert pairs == select_pairs(rewards, selection, count, torch.Generator().manual_seed(seed))
