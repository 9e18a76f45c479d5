"""Multi-turn episodes: returns and credit against hand-computed trees, transitions, and end to end."""

import os

import pytest
import torch
from datasets import Dataset

from comlrl_hf import MAGRPOConfig, MAGRPOTrainer
from comlrl_hf.rollout.multiturn import (
    credit_to_agents, discounted_returns, format_turn_prompt, joint_actions, tree_nodes_per_prompt,
)

from conftest import PROMPTS, length_ratio_reward


def test_joint_actions_and_tree_size():
    assert joint_actions(2, 2, "aligned") == [(0, 0), (1, 1)]
    assert joint_actions(2, 2, "cross") == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert tree_nodes_per_prompt(4, 2, 3, "aligned") == 1 + 4 + 16
    assert tree_nodes_per_prompt(2, 3, 2, "cross") == 1 + 8
    with pytest.raises(ValueError, match="joint_mode must be one of"):
        joint_actions(2, 2, "crossed")


def test_discounted_returns_by_hand():
    """A root with 2 joint actions whose children are leaves with 2 joint actions each."""
    rewards = [torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 5.0]])]
    returns = discounted_returns(rewards, [[[0, 0]], [None]], discount=0.5)  # both actions -> the same leaf
    assert torch.allclose(returns[0], torch.tensor([[1.0 + 0.5 * 4.0, 2.0 + 0.5 * 4.0]]))
    # two children with different futures, discount 1
    rewards = [torch.tensor([[0.0, 1.0]]), torch.tensor([[2.0, 4.0], [10.0, 0.0]])]
    returns = discounted_returns(rewards, [[[0, 1]], [None, None]], discount=1.0)
    assert torch.allclose(returns[0], torch.tensor([[0.0 + 3.0, 1.0 + 5.0]]))
    assert torch.equal(returns[1], rewards[1])  # leaves keep their rewards
    # a terminated root keeps its immediate rewards
    assert torch.equal(discounted_returns([torch.tensor([[1.0, 2.0]])], [[None]], 0.9)[0], torch.tensor([[1.0, 2.0]]))


def test_credit_aligned_is_identity_and_cross_is_the_mean_over_containing_actions():
    G = torch.tensor([1.0, 2.0])
    assert torch.equal(credit_to_agents(G, joint_actions(2, 2, "aligned"), 2), torch.tensor([[1.0, 2.0], [1.0, 2.0]]))
    # cross, K=2, N=2: actions (0,0)=1, (0,1)=2, (1,0)=3, (1,1)=6
    G = torch.tensor([1.0, 2.0, 3.0, 6.0])
    credit = credit_to_agents(G, joint_actions(2, 2, "cross"), 2)
    # agent 0: k=0 in (0,0),(0,1) -> 1.5 ; k=1 in (1,0),(1,1) -> 4.5 ; agent 1: k=0 -> (1+3)/2, k=1 -> (2+6)/2
    assert torch.equal(credit, torch.tensor([[1.5, 4.5], [2.0, 4.0]]))


def test_format_turn_prompt_variants():
    item = {"prompt": "orig", "topic": "x"}
    plain = lambda it: f"Q: {it['prompt']}"
    with_external = lambda it, external_prompts=None: f"{it['topic']} | {external_prompts}"
    assert format_turn_prompt(plain, item, None, False) == "Q: orig"
    assert format_turn_prompt(plain, item, "feedback", False) == "Q: feedback"
    assert format_turn_prompt(plain, item, "feedback", True) == "feedback"
    assert format_turn_prompt(with_external, item, "feedback", False) == "x | feedback"


def feedback_transition(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
    """Tell each agent whether its answer was too short, as the next turn's prompt."""
    return [
        f"{prompt} Your answer was {'too short' if len(c) < 10 else 'fine'}; improve it:" for c in agent_completions
    ]


def _config(**kw):
    base = dict(num_turns=2, num_generations=2, max_new_tokens=6, num_train_epochs=1, logging_steps=1, report_to=[],
                disable_tqdm=True)
    return MAGRPOConfig(**{**base, **kw})


def test_two_turn_feedback_episode(llama_dir, qwen_dir, dataset):
    calls, seen_prompts = [], []

    def transition(**kwargs):
        calls.append(kwargs)
        return feedback_transition(**kwargs)

    def formatter(item, external_prompts=None):
        seen_prompts.append(external_prompts)
        return external_prompts or item["prompt"]

    trainer = MAGRPOTrainer(agents=[llama_dir, qwen_dir], reward_func=length_ratio_reward, formatters=formatter,
                            external_transition=transition, train_dataset=dataset, args=_config())
    trainer.train()
    # per step: 2 prompts x 2 joint actions at turn 1, then 4 nodes x 2 at turn 2
    assert trainer.env_step == 2 * (2 * 2 + 4 * 2)
    assert len(calls) == 2 * 4  # one transition per joint action of turn 1
    first = calls[0]
    assert first["num_agents"] == 2 and len(first["agent_completions"]) == 2
    assert [len(h) for h in first["prompt_history_per_agent"]] == [1, 1]
    assert first["response_history_per_agent"][1] == [first["agent_completions"][1]]
    assert any(p is not None and "Your answer was" in p for p in seen_prompts)
    logs = [log for log in trainer.state.log_history if "loss" in log]
    assert {"turn_1/reward_mean", "turn_2/reward_mean", "turn_1/expected_return", "turn_2/expected_return"} <= logs[0].keys()
    # undiscounted: turn-1 expected return = turn-1 reward + mean turn-2 reward
    assert logs[0]["turn_1/expected_return"] == pytest.approx(logs[0]["turn_1/reward_mean"] + logs[0]["turn_2/reward_mean"], abs=1e-5)


def test_cross_mode_and_early_termination(qwen_dir, dataset):
    calls = []
    trainer = MAGRPOTrainer(agent_model=qwen_dir, reward_func=length_ratio_reward,
                            external_transition=lambda **kw: calls.append(1) or feedback_transition(**kw),
                            train_dataset=dataset, args=_config(joint_mode="cross"))
    trainer.train()
    assert trainer.env_step == 2 * (2 * 4 + 8 * 4)  # J = K^N = 4 joint actions per node
    assert len(calls) == 2 * 2 * 4
    stop = MAGRPOTrainer(agent_model=qwen_dir, reward_func=lambda c1, c2: [1.0] * len(c1),
                         external_transition=feedback_transition, train_dataset=dataset,
                         args=_config(early_termination_threshold=0.5))
    stop.train()
    assert stop.env_step == 2 * 2 * 2  # every root's mean reward 1.0 > 0.5: no second turn


def test_bad_transitions_name_the_turn(qwen_dir, dataset):
    for bad, message in [
        (lambda **kw: ["only one"], r"must return 2 prompts \(one per agent\) after turn 1"),
        (lambda **kw: "a string", "must return 2 prompts"),
        (lambda **kw: ["ok", 3], "returned a int for agent 1 after turn 1"),
    ]:
        trainer = MAGRPOTrainer(agent_model=qwen_dir, reward_func=length_ratio_reward, external_transition=bad,
                                train_dataset=dataset, args=_config())
        with pytest.raises(ValueError, match=message):
            trainer.train()


def test_multi_turn_is_checked_at_construction(qwen_dir, dataset):
    with pytest.raises(ValueError, match="num_turns=2 needs an external_transition"):
        MAGRPOTrainer(agent_model=qwen_dir, reward_func=length_ratio_reward, train_dataset=dataset, args=_config())
    with pytest.raises(ValueError, match="has 273 nodes per prompt, more than max_tree_nodes=256"):
        MAGRPOTrainer(agents=[qwen_dir] * 2, reward_func=length_ratio_reward, external_transition=feedback_transition,
                      train_dataset=dataset, args=_config(num_turns=3, num_generations=4, joint_mode="cross"))


def test_multi_turn_evaluation_follows_one_path(llama_dir, qwen_dir, dataset):
    seen = {}

    def eval_logger(agent_completions_turns, batch_items, prompts):
        seen["turns"] = [len(per_item) for per_item in agent_completions_turns[0]]
        return [{"n": 1.0} for _ in batch_items]

    trainer = MAGRPOTrainer(agents=[llama_dir, qwen_dir], reward_func=length_ratio_reward,
                            external_transition=feedback_transition, eval_dataset=dataset, train_dataset=dataset,
                            eval_logger=eval_logger, eval_aggregator=lambda m, num_turns: {"items": len(m)},
                            args=_config(per_device_eval_batch_size=3))
    metrics = trainer.evaluate()
    assert seen["turns"] == [2, 2, 2, 2]
    assert {"eval_turn_1/reward_mean", "eval_turn_2/expected_return", "eval_items"} <= metrics.keys()


def test_multi_turn_resume_is_bitwise(llama_dir, qwen_dir):
    def build(epochs):
        return MAGRPOTrainer(agents=[llama_dir, qwen_dir], reward_func=length_ratio_reward,
                             external_transition=feedback_transition, train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                             args=_config(num_train_epochs=epochs, agent_learning_rate=1e-3, output_dir="out"))

    full = build(2)
    full.train()
    first = build(1)
    first.train(checkpoint_dir="ck")
    resumed = build(2)
    resumed.train(resume_from_checkpoint="ck/checkpoint-1")
    for a, b in zip(full.agents, resumed.agents):
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    steps = lambda t: [log for log in t.state.log_history if "loss" in log]
    assert steps(full) == steps(resumed)
