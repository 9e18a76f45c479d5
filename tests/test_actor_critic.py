"""IAC and MAAC: spec §2.1, §2.2, §4.3 on tiny models, critic mismatches, GAE and value loss by hand,
bitwise resume, and learning."""

import math
import os
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from comlrl_hf import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from comlrl_hf.utils.advantages import tree_gae
from comlrl_hf.utils.losses import value_loss

from conftest import PROMPTS, length_ratio_reward, space_share_reward

FAST = dict(max_new_tokens=6, num_train_epochs=1, report_to=[], logging_steps=1, disable_tqdm=True)


@pytest.fixture()
def tokenizers(llama_dir, qwen_dir):
    return [AutoTokenizer.from_pretrained(llama_dir), AutoTokenizer.from_pretrained(qwen_dir)]


# ---- math ----

def test_tree_gae_by_hand():
    # one episode of two turns: rows continue 0 -> 0
    rewards = [torch.tensor([1.0]), torch.tensor([2.0])]
    values = [torch.tensor([0.5]), torch.tensor([1.5])]
    adv, tgt = tree_gae(rewards, values, [[0], [None]], gamma=0.9, lam=0.5)
    delta1 = 2.0 - 1.5
    delta0 = 1.0 + 0.9 * 1.5 - 0.5
    assert adv[1].item() == pytest.approx(delta1)
    assert adv[0].item() == pytest.approx(delta0 + 0.9 * 0.5 * delta1)
    assert tgt[0].item() == pytest.approx(adv[0].item() + 0.5)
    # lambda = 0 is TD(0): target = r + gamma V'
    _, td = tree_gae(rewards, values, [[0], [None]], gamma=0.9, lam=0.0)
    assert td[0].item() == pytest.approx(1.0 + 0.9 * 1.5)
    # lambda = 1 is the Monte-Carlo return
    _, mc = tree_gae(rewards, values, [[0], [None]], gamma=0.9, lam=1.0)
    assert mc[0].item() == pytest.approx(1.0 + 0.9 * 2.0)
    # single turn, K rows: A = r - V
    adv, _ = tree_gae([torch.tensor([1.0, 0.0])], [torch.tensor([0.25, 0.25])], [[None, None]], 1.0, 0.95)
    assert torch.allclose(adv[0], torch.tensor([0.75, -0.25]))


def test_value_loss_by_hand():
    values, targets, old = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), torch.tensor([0.5, 0.5])
    assert value_loss(values, targets).item() == pytest.approx(1.0)
    # clipped: V_clip = old + clip(V - old, -0.2, 0.2) = (0.7, 0.3): losses max(1, 0.49)=1, max(1, 0.49)=1
    assert value_loss(values, targets, old, 0.2).item() == pytest.approx(1.0)
    values = torch.tensor([0.1, 0.9])  # unclipped (0.01, 0.01); clipped V=(0.3, 0.7): (0.09, 0.09)
    assert value_loss(values, targets, old, 0.2).item() == pytest.approx(0.09)


# ---- spec examples ----

def test_spec_2_1_maac_and_4_3_restore(llama_dir, qwen_dir, tokenizers, dataset, tmp_path):
    trainer = MAACTrainer(
        agent_model=None, agents=[llama_dir, qwen_dir], tokenizer=tokenizers,
        critic_model=qwen_dir, critics=None, reward_func=length_ratio_reward, train_dataset=dataset,
        args=MAACConfig(num_agents=2, num_turns=1, temperature=0.7, top_p=0.9, top_k=None, **FAST),
    )
    trainer.train()
    saved_dir = tmp_path / "saved"
    trainer.save_model(str(saved_dir))
    assert AutoModelForCausalLM.from_pretrained(saved_dir / "critic").config.model_type == "qwen2"
    assert (saved_dir / "critic" / "value_head.pt").is_file()
    actor_dirs = [str(saved_dir / "agent_0"), str(saved_dir / "agent_1")]
    continued_maac = MAACTrainer(agents=actor_dirs,
        tokenizer=[AutoTokenizer.from_pretrained(p) for p in actor_dirs],
        critic_model=str(saved_dir / "critic"), reward_func=length_ratio_reward,
        train_dataset=dataset, args=MAACConfig(num_agents=2, num_turns=1, num_train_epochs=3, report_to=[]))
    head = continued_maac.critics[0].value_head
    assert not torch.equal(head.net[0].weight, trainer.critics[0].value_head.net[0].weight)  # a new head ...
    continued_maac.critics[0].value_head.load_state_dict(
        torch.load(saved_dir / "critic" / "value_head.pt", map_location="cpu", weights_only=True))
    assert torch.equal(head.net[0].weight, trainer.critics[0].value_head.net[0].weight)  # ... until restored
    for old, new in zip(trainer.critics[0].parameters(), continued_maac.critics[0].parameters()):
        assert torch.equal(old, new)


@pytest.mark.parametrize("separate", [True, False])
def test_spec_2_2_iac_and_4_3_restore(separate, llama_dir, qwen_dir, tokenizers, dataset, tmp_path):
    trainer = IACTrainer(
        agent_model=None, agents=[llama_dir, qwen_dir], tokenizer=tokenizers,
        critic_model=None, critics=[llama_dir, qwen_dir] if separate else None,
        reward_func=length_ratio_reward, train_dataset=dataset,
        args=IACConfig(num_agents=2, num_turns=1, use_separate_critic=separate, temperature=0.7, top_p=0.9,
                       top_k=None, value_head_hidden_dim=8, critic_value_head_hidden_dim=4, **FAST),
    )
    trainer.train()
    saved = tmp_path / "saved"
    trainer.save_model(str(saved))
    actor_dirs = [str(saved / f"agent_{i}") for i in range(2)]
    kwargs = dict(critics=[str(saved / f"agent_{i}" / "critic") for i in range(2)]) if separate else {}
    continued_iac = IACTrainer(agents=actor_dirs, tokenizer=[AutoTokenizer.from_pretrained(p) for p in actor_dirs],
                               reward_func=length_ratio_reward, train_dataset=dataset,
                               args=IACConfig(num_agents=2, num_turns=1, num_train_epochs=3, use_separate_critic=separate,
                                              value_head_hidden_dim=8, critic_value_head_hidden_dim=4, report_to=[]),
                               **kwargs)
    for i in range(2):
        owner_old = trainer.critics[i] if separate else trainer.agents[i]
        owner_new = continued_iac.critics[i] if separate else continued_iac.agents[i]
        folder = saved / f"agent_{i}" / ("critic" if separate else "")
        owner_new.value_head.load_state_dict(torch.load(folder / "value_head.pt", map_location="cpu", weights_only=True))
        for old, new in zip(owner_old.parameters(), owner_new.parameters()):
            assert torch.equal(old, new)
        assert AutoModelForCausalLM.from_pretrained(folder).config.model_type == ("llama", "qwen2")[i]


def test_iac_homogeneous_critic_model_loads_one_copy_per_agent(qwen_dir, dataset):
    trainer = IACTrainer(agent_model=qwen_dir, num_agents=2, critic_model=qwen_dir, reward_func=length_ratio_reward,
                         train_dataset=dataset, args=IACConfig(**FAST))
    assert trainer.critics[0] is not trainer.critics[1]
    names = [g["name"] for g in trainer.create_optimizer().param_groups]
    assert names == ["agent_0", "agent_1", "critic_0", "critic_1"]


def test_critic_mismatches_raise_at_construction(llama_dir, qwen_dir, tokenizers, dataset):
    base = dict(reward_func=length_ratio_reward, train_dataset=dataset)
    cases = [
        (IACTrainer, dict(agent_model=qwen_dir, critics=[qwen_dir, qwen_dir], args=IACConfig(use_separate_critic=False)),
         "critic_model and critics must be None when use_separate_critic=False"),
        (IACTrainer, dict(agent_model=qwen_dir, args=IACConfig()),
         "either critic_model or critics must be provided when use_separate_critic=True"),
        (IACTrainer, dict(agent_model=qwen_dir, critics=[qwen_dir], args=IACConfig()), "critics has 1 entries but 2 are expected"),
        (IACTrainer, dict(agent_model=qwen_dir, critic_model=qwen_dir, critics=[qwen_dir, llama_dir], args=IACConfig()),
         r"critic_model='.*qwen2' conflicts with critics\[1\]='.*llama'"),
        (IACTrainer, dict(agents=[llama_dir, qwen_dir], critics=[llama_dir, qwen_dir], args=IACConfig()),
         "tokenizer must be provided when agents is given"),
        (IACTrainer, dict(agents=[qwen_dir, llama_dir], tokenizer=tokenizers[::-1], critics=[llama_dir, llama_dir], args=IACConfig()),
         r"tokenizer for critics\[0\] \(with agent 0's tokenizer\) has 384 tokens but the model's embedding table has 229 rows"),
        (MAACTrainer, dict(agent_model=qwen_dir, args=MAACConfig()), "either critic_model or critics \\(one element\\)"),
        (MAACTrainer, dict(agent_model=qwen_dir, critics=[qwen_dir, qwen_dir], args=MAACConfig()),
         "critics has 2 entries but 1 are expected"),
        (MAACTrainer, dict(agent_model=qwen_dir, critic_model=qwen_dir, model_config={"critic_value_head_hidden_dim": 0},
                           args=MAACConfig()), "hidden_dim must be a positive integer or None, got 0"),
        (IACTrainer, dict(agent_model=qwen_dir, critic_model=qwen_dir, args=MAACConfig()),
         "IACTrainer needs args of type IACConfig, got MAACConfig"),
    ]
    for cls, kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            cls(**base, **kwargs)
    for kwargs, message in [
        (dict(num_turns=2, num_generations=2), "multi-turn actor-critic \\(num_turns=2\\) needs num_generations=1, got 2"),
        (dict(critic_type="w"), "critic_type must be 'v' or 'q', got 'w'"),
        (dict(gae_lambda=1.5), "gae_lambda must be in \\[0, 1\\], got 1.5"),
        (dict(joint_mode="cross"), "actor-critic trainers use joint_mode='aligned'"),
    ]:
        with pytest.raises(ValueError, match=message):
            IACConfig(**kwargs)


# ---- resume ----

def _ac_trainer(kind, dirs, epochs, tokenizers, num_turns=1):
    transition = (lambda prompt, agent_completions, **kw: [f"{prompt} again:" for _ in agent_completions]) if num_turns > 1 else None
    common = dict(agents=dirs, tokenizer=tokenizers, reward_func=length_ratio_reward, external_transition=transition,
                  train_dataset=Dataset.from_dict({"prompt": PROMPTS}))
    settings = dict(FAST, num_train_epochs=epochs, agent_learning_rate=1e-3, output_dir="out", num_turns=num_turns,
                    num_generations=2 if num_turns == 1 else 1)
    if kind == "maac":
        return MAACTrainer(critic_model=dirs[1], args=MAACConfig(critic_type="q", **settings), **common)
    separate = kind == "iac-separate"
    return IACTrainer(critics=list(dirs) if separate else None, args=IACConfig(use_separate_critic=separate, **settings), **common)


@pytest.mark.parametrize("kind, turns", [("iac-separate", 1), ("iac-shared", 2), ("maac", 1), ("maac", 2)])
def test_actor_critic_resume_is_bitwise(kind, turns, llama_dir, qwen_dir, tokenizers):
    dirs = [llama_dir, qwen_dir]
    full = _ac_trainer(kind, dirs, 2, tokenizers, turns)
    full.train()
    first = _ac_trainer(kind, dirs, 1, tokenizers, turns)
    first.train(checkpoint_dir="ck")
    resumed = _ac_trainer(kind, dirs, 2, tokenizers, turns)
    resumed.train(resume_from_checkpoint="ck/checkpoint-1")
    for a, b in zip(full.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)
    logs = lambda t: [log for log in t.state.log_history if "loss" in log]
    assert logs(full) == logs(resumed)
    if turns > 1:
        assert "turn_2/reward_mean" in logs(full)[0]


# ---- learning ----

class _Logs(TrainerCallback):
    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "reward" in logs:
            self.logs.append(dict(logs))


@pytest.mark.parametrize("separate", [True, False])
def test_iac_learns_and_its_value_loss_falls(separate, llama_dir, qwen_dir, tokenizers):
    record = _Logs()
    trainer = IACTrainer(
        agents=[llama_dir, qwen_dir], tokenizer=tokenizers, critics=[llama_dir, qwen_dir] if separate else None,
        reward_func=space_share_reward, train_dataset=Dataset.from_dict({"prompt": PROMPTS * 2}), callbacks=[record],
        args=IACConfig(use_separate_critic=separate, num_train_epochs=8, per_device_train_batch_size=2,
                       num_generations=8, max_new_tokens=12, temperature=1.0, top_p=1.0, top_k=None,
                       agent_learning_rate=3e-3, critic_learning_rate=3e-3, logging_steps=1, report_to=[],
                       disable_tqdm=True, seed=0),
    )
    trainer.train()
    quarter = len(record.logs) // 4
    mean = lambda rows, key: sum(r[key] for r in rows) / len(rows)
    rewards = (mean(record.logs[:quarter], "reward"), mean(record.logs[-quarter:], "reward"))
    value_losses = (mean(record.logs[:quarter], "agent_1/value_loss"), mean(record.logs[-quarter:], "agent_1/value_loss"))
    print(f"IAC separate={separate}: reward {rewards[0]:.3f} -> {rewards[1]:.3f}, "
          f"value loss {value_losses[0]:.4f} -> {value_losses[1]:.4f}")
    assert rewards[1] > rewards[0] + 0.05
    assert value_losses[1] < value_losses[0]
