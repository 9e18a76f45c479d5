"""MAGRPO end to end on tiny models: reward calls, errors, logging, evaluation, variants, learning."""

import inspect
import math

import pytest
import torch
from transformers import Trainer, TrainerCallback

from comlrl_hf import MAGRPOConfig, MAGRPOTrainer, MAREINFORCEConfig, MAREINFORCETrainer, MARLOOTrainer, MARLOOConfig
from comlrl_hf import MAReMaxConfig, MAReMaxTrainer

from conftest import PROMPTS, length_ratio_reward, space_share_reward


def _config(cls=MAGRPOConfig, **kw):
    base = dict(num_train_epochs=1, max_new_tokens=8, report_to=[], logging_steps=1, num_generations=3)
    return cls(**{**base, **kw})


def test_reward_called_once_per_batch_with_aligned_lists(llama_dir, qwen_dir, dataset):
    calls = []

    def reward(completions1, completions2, prompts, batch_items):
        calls.append((list(completions1), list(completions2), list(prompts), list(batch_items)))
        return [0.5] * len(completions1)

    trainer = MAGRPOTrainer(agents=[llama_dir, qwen_dir], reward_func=reward, train_dataset=dataset,
                            args=_config(per_device_train_batch_size=2))
    trainer.train()
    assert len(calls) == 2  # 4 prompts / 2 per batch
    for c1, c2, prompts, items in calls:
        assert len(c1) == len(c2) == len(prompts) == len(items) == 2 * 3
        assert prompts[0] == prompts[1] == prompts[2] and prompts[3] == prompts[4] == prompts[5]
        assert [it["prompt"] for it in items] == prompts
    assert sorted({p for call in calls for p in call[2]}) == sorted(PROMPTS)
    assert trainer.env_step == 4 * 3


def test_formatters_per_agent_and_chat_messages(llama_dir, qwen_dir, dataset):
    seen = {0: [], 1: []}

    def reward(c1, c2):
        return [1.0] * len(c1)

    def first(item):
        seen[0].append(item["prompt"])
        return "Plan: " + item["prompt"]

    def second(item):
        seen[1].append(item["prompt"])
        return [{"role": "user", "content": item["prompt"]}]

    trainer = MAGRPOTrainer(agents=[llama_dir, qwen_dir], reward_func=reward, formatters=[first, second],
                            train_dataset=dataset, args=_config())
    trainer.train()
    assert sorted(seen[0]) == sorted(seen[1]) == sorted(PROMPTS)


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda c1, c2: [1.0] * (len(c1) - 1), r"returned 5 rewards at step 0 but 6 joint actions"),
        (lambda c1, c2: [float("nan")] * len(c1), r"returned nan for joint action 0 at step 0 \(prompt '"),
        (lambda c1, c2: [None] * len(c1), r"returned None for joint action 0"),
        (lambda c1, c2: "1.0", r"must return a sequence of 6 floats"),
        (lambda c1, c2: 1.0, r"must return a sequence of 6 floats .* got float"),
    ],
)
def test_bad_rewards_raise_with_context(bad, message, qwen_dir, dataset):
    trainer = MAGRPOTrainer(agent_model=qwen_dir, reward_func=bad, train_dataset=dataset, args=_config())
    with pytest.raises(ValueError, match=message):
        trainer.train()


def test_type_error_inside_reward_is_not_swallowed(qwen_dir, dataset):
    calls = []

    def reward(c1, c2):
        calls.append(1)
        return [len(c) + "x" for c in c1]  # a bug in user code

    trainer = MAGRPOTrainer(agent_model=qwen_dir, reward_func=reward, train_dataset=dataset, args=_config())
    with pytest.raises(TypeError, match="unsupported operand"):
        trainer.train()
    assert calls == [1]  # called once, not retried with another convention


def test_reward_processor_and_tensor_rewards(qwen_dir, dataset):
    seen = []

    def reward(c1, c2):
        return torch.ones(len(c1))

    trainer = MAGRPOTrainer(agent_model=qwen_dir, reward_func=reward, reward_processor=lambda r: seen.append(r) or 3 * r,
                            train_dataset=dataset, args=_config())
    trainer.train()
    assert seen and set(seen) == {1.0}
    assert all(log["reward"] == 3.0 for log in trainer.state.log_history if "reward" in log)


def test_logs_carry_env_step_and_per_agent_diagnostics(llama_dir, qwen_dir, dataset):
    trainer = MAGRPOTrainer(agents=[llama_dir, qwen_dir], reward_func=length_ratio_reward, train_dataset=dataset,
                            args=_config(num_train_epochs=2))
    trainer.train()
    logs = [log for log in trainer.state.log_history if "loss" in log]
    assert len(logs) == 4
    assert [log["env_step"] for log in logs] == [6, 12, 18, 24]
    for i in range(2):
        for key in ("loss", "entropy", "clip_ratio", "completion_length", "grad_norm", "learning_rate"):
            assert math.isfinite(logs[0][f"agent_{i}/{key}"]), key
    assert {"reward", "reward_std", "loss", "grad_norm"} <= logs[0].keys()
    assert logs[0]["agent_0/learning_rate"] == trainer.args.agent_learning_rate


def test_optimizer_has_one_group_per_agent(llama_dir, qwen_dir, dataset):
    trainer = MAGRPOTrainer(agents=[llama_dir, qwen_dir], reward_func=length_ratio_reward, train_dataset=dataset,
                            args=_config(agent_learning_rate=3e-4, weight_decay=0.1))
    optimizer = trainer.create_optimizer()
    names = [g["name"] for g in optimizer.param_groups]
    assert names == ["agent_0", "agent_0/no_decay", "agent_1", "agent_1/no_decay"]
    assert all(g["lr"] == 3e-4 for g in optimizer.param_groups)
    grouped = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert grouped == {id(p) for p in trainer.model.parameters()}


def test_gradients_are_clipped_per_agent(llama_dir, qwen_dir, dataset):
    trainer = MAGRPOTrainer(agents=[llama_dir, qwen_dir], reward_func=length_ratio_reward, train_dataset=dataset,
                            args=_config(max_grad_norm=1.0))
    trainer.create_optimizer()
    for scale, agent in zip((100.0, 1e-3), trainer.agents):
        for p in agent.parameters():
            p.grad = torch.full_like(p, scale)
    small_before = [p.grad.clone() for p in trainer.agents[1].parameters()]
    total = trainer._clip_grad_norm(trainer.model)
    norm0 = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in trainer.agents[0].parameters()]))
    assert norm0.item() == pytest.approx(1.0, rel=1e-4)
    # the small agent is untouched: a joint clip would have scaled it down by ~1e-5
    assert all(torch.equal(a, p.grad) for a, p in zip(small_before, trainer.agents[1].parameters()))
    assert total.item() > 100


def test_trainer_loop_still_calls_the_hooks_we_override():
    """Tripwire: our per-agent clipping and step rely on these calls inside Trainer's private loop."""
    source = inspect.getsource(Trainer._run_epoch)
    assert "self._clip_grad_norm(model)" in source
    assert "self.training_step(model, inputs, num_items_in_batch)" in source
    assert "self.current_gradient_accumulation_steps = len(batch_samples)" in source


def test_rollout_reuse_clips_and_generates_once_per_iteration_group(qwen_dir, dataset):
    trainer = MAGRPOTrainer(agent_model=qwen_dir, reward_func=length_ratio_reward, train_dataset=dataset,
                            args=_config(num_ppo_epochs=2, agent_learning_rate=1e-2))
    calls = []
    original = trainer.rollout
    trainer.rollout = lambda batch: calls.append([b["prompt"] for b in batch]) or original(batch)
    trainer.train()
    assert trainer.state.global_step == 4  # 2 batches x 2 passes
    assert len(calls) == 2 and sorted(p for c in calls for p in c) == sorted(PROMPTS)
    logs = [log for log in trainer.state.log_history if "loss" in log]
    assert [log["env_step"] for log in logs] == [6, 6, 12, 12]
    assert any(log["agent_0/clip_ratio"] > 0 for log in logs[1::2])  # second pass is off-policy with a big lr


def test_reference_kl(qwen_dir, dataset):
    trainer = MAGRPOTrainer(agent_model=qwen_dir, reward_func=length_ratio_reward, train_dataset=dataset,
                            args=_config(beta=0.1, agent_learning_rate=1e-2, num_train_epochs=2))
    trainer.train()
    assert len(trainer.ref_agents) == 2 and not any(p.requires_grad for p in trainer.ref_agents[0].parameters())
    logs = [log for log in trainer.state.log_history if "loss" in log]
    assert logs[0]["agent_0/kl"] == pytest.approx(0.0, abs=1e-6)  # first step: policy == reference
    assert logs[-1]["agent_0/kl"] > 0


def test_evaluate_is_greedy_and_feeds_logger_and_aggregator(llama_dir, qwen_dir, dataset):
    seen = {}

    def eval_logger(agent_completions_turns, batch_items, prompts):
        seen["shape"] = (len(agent_completions_turns), len(agent_completions_turns[0]), len(agent_completions_turns[0][0]))
        return [{"len_0": len(a[0]), "len_1": len(b[0])} for a, b in zip(*agent_completions_turns)]

    def eval_aggregator(metrics, num_turns):
        return {"mean_len_1": sum(m["len_1"] for m in metrics) / len(metrics), "turns": num_turns}

    trainer = MAGRPOTrainer(agents=[llama_dir, qwen_dir], reward_func=length_ratio_reward, train_dataset=dataset,
                            eval_dataset=dataset, eval_logger=eval_logger, eval_aggregator=eval_aggregator,
                            args=_config(per_device_eval_batch_size=3))
    first, second = trainer.evaluate(), trainer.evaluate()
    assert seen["shape"] == (2, 4, 1)
    assert first["eval_reward"] == second["eval_reward"]  # greedy decoding is deterministic
    assert {"eval_reward", "eval_reward_std", "eval_mean_len_1", "eval_turns"} <= first.keys()
    assert trainer.env_step == 0  # evaluation scores no training env steps


def test_variant_trainers_use_their_baselines(qwen_dir, dataset):
    for trainer_cls, config_cls, mode in [
        (MAREINFORCETrainer, MAREINFORCEConfig, "raw"),
        (MARLOOTrainer, MARLOOConfig, "rloo"),
        (MAReMaxTrainer, MAReMaxConfig, "max"),
    ]:
        trainer = trainer_cls(agent_model=qwen_dir, reward_func=length_ratio_reward, train_dataset=dataset,
                              args=_config(config_cls))
        assert trainer.args.advantage_mode == mode
        trainer.train()
        assert trainer.state.global_step == 2
    with pytest.raises(ValueError, match="MARLOOTrainer needs args of type MARLOOConfig, got MAGRPOConfig"):
        MARLOOTrainer(agent_model=qwen_dir, reward_func=length_ratio_reward, args=_config())


class _RewardLog(TrainerCallback):
    def __init__(self):
        self.rewards = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "reward" in logs:
            self.rewards.append(logs["reward"])


def test_tiny_agents_learn_a_learnable_reward(llama_dir, qwen_dir):
    """The joint reward rises over a few dozen steps (measured, with sampling on)."""
    from datasets import Dataset

    log = _RewardLog()
    trainer = MAGRPOTrainer(
        agents=[llama_dir, qwen_dir], reward_func=space_share_reward,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS * 2}),
        callbacks=[log],
        args=MAGRPOConfig(num_train_epochs=8, per_device_train_batch_size=2, num_generations=8, max_new_tokens=12,
                          temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=3e-3, logging_steps=1,
                          report_to=[], seed=0),
    )
    trainer.train()
    rewards = log.rewards
    assert len(rewards) == 32
    first, last = sum(rewards[:8]) / 8, sum(rewards[-8:]) / 8
    assert last > first + 0.1, (first, last, rewards)


def test_log_completions_prints_a_sample_table(llama_dir, qwen_dir, dataset, capsys):
    trainer = MAGRPOTrainer(agents=[llama_dir, qwen_dir], reward_func=length_ratio_reward, train_dataset=dataset,
                            args=_config(log_completions=True, num_completions_to_print=2))
    trainer.train()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step:")]
    assert len(lines) == 2 * 2  # two rows at each of the two logs
    assert all("prompt:" in line and "agent_0:" in line and "agent_1:" in line and "reward:" in line for line in lines)


def test_generation_stops_at_every_configured_eos(qwen_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from comlrl_hf.rollout.generation import eos_token_ids, render_prompts

    model, tok = AutoModelForCausalLM.from_pretrained(qwen_dir), AutoTokenizer.from_pretrained(qwen_dir)
    model.generation_config.eos_token_id = [tok.eos_token_id, 7]
    assert eos_token_ids(model, tok) == [tok.eos_token_id, 7]
    with pytest.raises(ValueError, match="mix plain text and chat messages"):
        render_prompts(tok, ["text", [{"role": "user", "content": "hi"}]])


def test_bad_dtype_names_the_value(qwen_dir, dataset):
    with pytest.raises(ValueError, match="model_config dtype 'float77' is not a torch dtype"):
        MAGRPOTrainer(agent_model=qwen_dir, model_config={"dtype": "float77"}, reward_func=length_ratio_reward,
                      train_dataset=dataset, args=_config())


@pytest.mark.parametrize("loss_type, beta", [("grpo", 0.0), ("dapo", 0.1), ("dr_grpo", 0.0)])
def test_loss_chunks_give_the_same_update_with_bounded_rows(llama_dir, qwen_dir, dataset, loss_type, beta):
    """`loss_chunk_size` splits the loss's forward+backward into row chunks: same losses and weights (up to
    rounding), and no forward ever sees more rows than the chunk."""
    def run(chunk):
        config = MAGRPOConfig(output_dir="out", max_steps=2, max_new_tokens=6, report_to=[], logging_steps=1,
                              agent_learning_rate=1e-3, per_device_train_batch_size=4, loss_type=loss_type, beta=beta,
                              loss_chunk_size=chunk, disable_tqdm=True)
        trainer = MAGRPOTrainer(agents=[llama_dir, qwen_dir], reward_func=length_ratio_reward, train_dataset=dataset,
                                args=config)
        rows = []
        for agent in trainer.agents:
            agent.register_forward_pre_hook(lambda m, a, kw: rows.append(kw["input_ids"].shape[0]) if m.training else None,
                                            with_kwargs=True)
        trainer.train()
        return trainer, rows

    whole, whole_rows = run(None)
    chunked, chunked_rows = run(5)
    assert max(whole_rows) == 16 and max(chunked_rows) == 5
    for a, b in zip(whole.agents, chunked.agents):
        for x, y in zip(a.parameters(), b.parameters()):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)  # Adam magnifies rounding in tiny grads
    logs = [[(log["loss"], log["reward"]) for log in t.state.log_history if "loss" in log] for t in (whole, chunked)]
    assert [r for _, r in logs[0]] == [r for _, r in logs[1]]
    assert [l for l, _ in logs[0]] == pytest.approx([l for l, _ in logs[1]], rel=1e-5, abs=1e-7)
    with pytest.raises(ValueError, match="loss_chunk_size must be an integer >= 1, got 0"):
        MAGRPOConfig(loss_chunk_size=0)


def test_objects_alive_before_training_are_frozen_for_the_garbage_collector_only_while_training(qwen_dir, dataset):
    import gc

    import weakref

    class Cycle:
        pass

    old = Cycle()
    old.me = old
    gc.collect()  # it survives a collection: an old-generation object, like a previous trainer in a notebook
    garbage = weakref.ref(old)
    del old  # now old-generation cyclic garbage when training starts

    class FreezeProbe(TrainerCallback):
        counts, garbage_alive = [], []

        def on_step_begin(self, args, state, control, **kwargs):
            self.counts.append(gc.get_freeze_count())
            self.garbage_alive.append(garbage() is not None)

    trainer = MAGRPOTrainer(agent_model=qwen_dir, num_agents=2, reward_func=length_ratio_reward, train_dataset=dataset,
                            args=_config(max_steps=1), callbacks=[FreezeProbe()])
    trainer.train()
    assert FreezeProbe.counts and min(FreezeProbe.counts) > 100_000  # torch/transformers objects skipped by full collections
    assert FreezeProbe.garbage_alive == [False]  # collected before the freeze, not kept for the run
    assert gc.get_freeze_count() == 0  # unfrozen after training
    gc.freeze()  # a caller's own freeze is left as it was
    try:
        trainer.train()
        assert gc.get_freeze_count() > 100_000  # still frozen: training did not unfreeze the caller's objects
    finally:
        gc.unfreeze()
