"""LoRA agents: shared-base adapters against separate PeftModels (gradients, generation, reference), saving,
AutoPeftModel round trips, merged export, bitwise resume, actor-critic paths and construction errors."""

import os

import pytest
import torch
from datasets import Dataset
from peft import AutoPeftModelForCausalLM, IA3Config, LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from comlrl_hf import IACConfig, IACTrainer, MAACConfig, MAACTrainer, MAGRPOConfig, MAGRPOTrainer
from comlrl_hf.models.peft_agents import AdapterAgent
from comlrl_hf.rollout.generation import generate_completions
from comlrl_hf.utils import CheckpointError
from comlrl_hf.utils.logprobs import completion_logps

from conftest import PROMPTS, length_ratio_reward

LORA = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])


def total_length(*completions):
    return [float(sum(len(c) for c in joint)) / 10 for joint in zip(*completions)]


def _config(n=2, **kw):
    settings = dict(output_dir="out", num_agents=n, num_train_epochs=1, max_new_tokens=6, num_generations=2,
                    per_device_train_batch_size=2, report_to=[], agent_learning_rate=1e-2, disable_tqdm=True)
    return MAGRPOConfig(**{**settings, **kw})


def code_sum(*completions):
    """Distinct for almost any two completions, so a group of samples never has all-zero advantages."""
    return [float(sum(ord(ch) for c in joint for ch in c) % 101) / 10 for joint in zip(*completions)]


def _trainer(path, n=2, backend=None, dataset=None, peft_config=LORA, reward_func=total_length, **kw):
    return MAGRPOTrainer(agent_model=path, num_agents=n, reward_func=reward_func, peft_config=peft_config,
                         peft_backend=backend, train_dataset=dataset or Dataset.from_dict({"prompt": PROMPTS}),
                         args=_config(n, **kw))


def _adapter_key(name: str) -> str:
    """A parameter name without its container prefix and adapter name, comparable across backends."""
    parts = name.replace("peft_model.", "", 1).split(".")
    return ".".join(p for p in parts if p not in {"default"} and not p.startswith("agent_"))


def _adapters(agent) -> dict:
    return {_adapter_key(n): p for n, p in agent.named_parameters() if "lora_" in n}


def _randomize_adapters(separate, shared, n):
    """Non-zero LoRA weights (B starts at 0), different per agent, identical in both backends."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for i in range(n):
            target = _adapters(shared.agents[i])
            for key, p in _adapters(separate.agents[i]).items():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.2)
                target[key].copy_(p)


def _grads(trainer, rollout, batch, checkpointing, summed=False):
    trainer.rollout = lambda _batch: rollout
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.train()
    if checkpointing is not None:
        trainer._container.activation_checkpointing_enable(checkpointing)
        assert all(agent.get_base_model().is_activation_checkpointing for agent in trainer.agents)
    trainer.model.zero_grad(set_to_none=True)
    if summed:  # the wrong way under checkpointing: one backward over every agent's loss
        sum(trainer.agent_loss(i, rollout) for i in range(trainer.num_agents)).backward()
    else:
        trainer.training_step(trainer.model, batch)
    return [{k: p.grad.clone() for k, p in _adapters(a).items()} for a in trainer.agents]


@pytest.mark.parametrize("n", [2, 4])
def test_shared_base_gradients_equal_separate_models(qwen_dir, n):
    separate, shared = _trainer(qwen_dir, n, "separate", reward_func=code_sum), _trainer(qwen_dir, n, "shared", reward_func=code_sum)
    assert shared.peft_backend == "shared" and all(isinstance(a, AdapterAgent) for a in shared.agents)
    assert len({id(a.peft_model) for a in shared.agents}) == 1  # one base for all agents
    assert all(isinstance(a, PeftModel) for a in separate.agents)
    _randomize_adapters(separate, shared, n)
    batch = [{"prompt": p} for p in PROMPTS[:2]]
    rollout = separate.rollout(batch)  # one fixed batch of completions and advantages for both backends
    for checkpointing in (None, {"use_reentrant": False}, {"use_reentrant": True}):  # off, then both kinds
        expected = _grads(separate, rollout, batch, checkpointing)
        got = _grads(shared, rollout, batch, checkpointing)
        for i in range(n):
            assert expected[i].keys() == got[i].keys() and len(got[i]) == 8  # 2 layers x (q, v) x (A, B)
            for key in expected[i]:
                assert expected[i][key].abs().sum() > 0, (checkpointing, i, key)
                torch.testing.assert_close(got[i][key], expected[i][key], rtol=1e-5, atol=1e-7)
    # the pitfall the per-agent backward avoids: under checkpointing, one summed backward is wrong for shared adapters
    wrong = _grads(shared, rollout, batch, {"use_reentrant": False}, summed=True)
    assert any(not torch.allclose(wrong[0][k], expected[0][k], rtol=1e-3, atol=1e-6) for k in expected[0])


def test_parameter_groups_hold_only_each_agents_adapter(qwen_dir):
    trainer = _trainer(qwen_dir, 3)
    groups = trainer.create_optimizer().param_groups
    assert [g["name"] for g in groups] == ["agent_0", "agent_1", "agent_2"]
    for i, group in enumerate(groups):
        own = {id(p) for n, p in trainer._container.named_parameters() if f".agent_{i}." in n}
        assert {id(p) for p in group["params"]} == own and len(own) == 8
    base = [p for n, p in trainer._container.named_parameters() if "lora_" not in n]
    assert base and not any(p.requires_grad for p in base)


def test_one_generate_call_equals_per_adapter_generation(qwen_dir):
    trainer = _trainer(qwen_dir, 3, "shared")
    _randomize_adapters(_trainer(qwen_dir, 3, "separate"), trainer, 3)
    prompts = [PROMPTS[:2], PROMPTS[1:4], PROMPTS[:2]]  # different lengths per agent: padding is trimmed per agent
    mixed = trainer._generate_all_agents(do_sample=False)(prompts, 1)
    for i, agent in enumerate(trainer.agents):
        alone = generate_completions(agent, trainer.tokenizers[i], prompts[i], 1, trainer.args.generation_kwargs(do_sample=False))
        assert mixed[i].completions == alone.completions
        for field in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask"):
            assert torch.equal(getattr(mixed[i], field), getattr(alone, field)), field
    # same prompts, different adapters: each row really ran its own agent's adapter
    assert not torch.equal(mixed[0].completion_ids, mixed[2].completion_ids)


def test_kl_reference_is_the_base_with_adapters_off(qwen_dir):
    trainer = _trainer(qwen_dir, 3, beta=0.1)
    assert len({id(r) for r in trainer.ref_agents}) == 1  # one reference for all agents, not a copy each
    assert sum(p.numel() for r in trainer.ref_agents for p in r.parameters()) == 0
    trainer.train()  # adapters now differ from zero, so "adapters off" is not trivially the same model
    base = AutoModelForCausalLM.from_pretrained(qwen_dir).eval()
    r = trainer._generate_for(1, PROMPTS[:2], 2)
    tensors = (r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask)
    with torch.no_grad():
        ref, _ = completion_logps(trainer.ref_agents[1], *tensors)
        plain, _ = completion_logps(base, *tensors)
        policy, _ = completion_logps(trainer.agents[1], *tensors)
    torch.testing.assert_close(ref, plain, rtol=0, atol=1e-6)
    assert not torch.allclose(policy, plain)


@pytest.mark.parametrize("backend", ["shared", "separate"])
def test_save_load_with_auto_peft_and_merged(qwen_dir, backend, tmp_path):
    trainer = _trainer(qwen_dir, 2, backend, agent_learning_rate=5e-2)
    trainer.train()
    trainer.save_model(str(tmp_path / "run"))
    trainer.save_merged_model(str(tmp_path / "merged"))
    x = torch.tensor([[5, 6, 7, 8, 9]])
    for i, agent in enumerate(trainer.agents):
        folder = tmp_path / "run" / f"agent_{i}"
        assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= set(os.listdir(folder))
        assert "model.safetensors" not in os.listdir(folder)
        agent.eval()
        with torch.no_grad():
            live = agent(input_ids=x).logits
            auto = AutoPeftModelForCausalLM.from_pretrained(folder).eval()(input_ids=x).logits
            manual = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(qwen_dir), folder).eval()(input_ids=x).logits
            merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged" / f"agent_{i}").eval()(input_ids=x).logits
            base = AutoModelForCausalLM.from_pretrained(qwen_dir).eval()(input_ids=x).logits
        assert torch.equal(live, auto) and torch.equal(live, manual)
        torch.testing.assert_close(merged, live, rtol=1e-4, atol=1e-5)
        assert not torch.allclose(live, base)  # training moved the adapter
    # spec §4.2 under LoRA: a new trainer continues from the saved adapter folders
    continued = MAGRPOTrainer(agents=[str(tmp_path / "run" / f"agent_{i}") for i in range(2)], reward_func=total_length,
                              train_dataset=Dataset.from_dict({"prompt": PROMPTS}), args=_config(2))
    with torch.no_grad():
        assert torch.equal(continued.agents[1].eval()(input_ids=x).logits, trainer.agents[1](input_ids=x).logits)
    assert continued.create_optimizer().param_groups[0]["params"]  # the loaded adapter is trainable


def test_resume_with_adapters_is_bitwise(qwen_dir):
    def build(epochs):
        return _trainer(qwen_dir, 2, logging_steps=1, num_train_epochs=epochs, beta=0.05)

    full = build(2)
    full.train(checkpoint_dir="full", checkpoint_interval=1)
    assert {"adapter_model.safetensors", "adapter_config.json"} <= set(os.listdir("full/checkpoint-1/agent_1"))
    first = build(1)
    first.train(checkpoint_dir="ck", checkpoint_interval=1)
    resumed = build(2)
    resumed.train(resume_from_checkpoint="ck/checkpoint-1", checkpoint_dir="ck", checkpoint_interval=1)
    for a, b in zip(full.agents, resumed.agents):
        sa, sb = a.state_dict(), b.state_dict()
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    oa, ob = full.optimizer.state_dict(), resumed.optimizer.state_dict()
    assert all(torch.equal(oa["state"][k][n], ob["state"][k][n]) for k in oa["state"] for n in oa["state"][k])
    logs = lambda t: [log for log in t.state.log_history if "loss" in log]  # noqa: E731
    assert logs(full) == logs(resumed) and len(logs(full)) == 4
    other = _trainer(qwen_dir, 2, logging_steps=1, num_train_epochs=3, beta=0.05,
                     peft_config=LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    with pytest.raises(CheckpointError, match="peft: checkpoint .*lora_alpha"):  # same shapes, other scaling
        other.train(resume_from_checkpoint="ck/checkpoint-2")


def test_actor_critic_with_lora(qwen_dir, tmp_path):
    dataset = Dataset.from_dict({"prompt": PROMPTS[:2]})
    ac = dict(output_dir="ac", num_train_epochs=1, max_new_tokens=6, num_generations=2, per_device_train_batch_size=2,
              report_to=[], disable_tqdm=True)
    iac = IACTrainer(agent_model=qwen_dir, num_agents=2, reward_func=total_length, train_dataset=dataset,
                     args=IACConfig(use_separate_critic=False, **ac), peft_config=LORA)
    assert iac.peft_backend == "shared"
    names = [g["name"] for g in iac.create_optimizer().param_groups]
    assert names == ["agent_0", "agent_0/value_head", "agent_1", "agent_1/value_head"]
    head_before = iac.agents[1].value_head.net[0].weight.detach().clone()
    iac.train()
    assert not torch.equal(head_before, iac.agents[1].value_head.net[0].weight)
    iac.save_model(str(tmp_path / "iac"))
    assert {"adapter_model.safetensors", "value_head.pt"} <= set(os.listdir(tmp_path / "iac" / "agent_1"))

    maac = MAACTrainer(agent_model=qwen_dir, num_agents=2, critic_model=qwen_dir, reward_func=total_length,
                       train_dataset=dataset, args=MAACConfig(**ac), peft_config=LORA, critic_peft_config=LORA)
    assert isinstance(maac.critics[0], PeftModel)
    trainable = {n for n, p in maac.critics[0].named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or n.startswith("value_head.") for n in trainable)
    maac.train()
    maac.save_model(str(tmp_path / "maac"))
    assert {"adapter_model.safetensors", "value_head.pt"} <= set(os.listdir(tmp_path / "maac" / "critic"))


def test_peft_construction_errors(qwen_dir, llama_dir, tmp_path):
    dataset = Dataset.from_dict({"prompt": PROMPTS})
    cases = [
        (dict(peft_config=[LORA] * 3), "peft_config has 3 entries but there are 2 agents"),
        (dict(peft_config=IA3Config(target_modules=["q_proj"])), r"peft_config must be a peft.LoraConfig, got IA3Config \(only LoRA"),
        (dict(peft_config=[LORA, {"r": 4}]), r"peft_config\[1\] must be a peft.LoraConfig, got dict"),
        (dict(peft_config=LoraConfig(task_type="SEQ_CLS")), "task_type must be CAUSAL_LM"),
        (dict(peft_backend="shared", agents=[qwen_dir, llama_dir], agent_model=None), "peft_backend='shared' needs homogeneous"),
        (dict(peft_backend="both"), "peft_backend must be one of"),
        (dict(peft_backend="shared", peft_config=None), "peft_backend='shared' needs a peft_config"),
    ]
    for kw, message in cases:
        args = dict(agent_model=qwen_dir, num_agents=2, reward_func=total_length, train_dataset=dataset,
                    args=_config(2), peft_config=LORA)
        args.update(kw)
        if "agents" in kw:
            args["tokenizer"] = None
        with pytest.raises(ValueError, match=message):
            MAGRPOTrainer(**args)
    wrapped = get_peft_model(AutoModelForCausalLM.from_pretrained(qwen_dir), LoraConfig(r=2, target_modules=["q_proj"]))
    with pytest.raises(ValueError, match=r"agents\[0\] already holds a PEFT adapter \(PeftModel\)"):
        MAGRPOTrainer(agents=[wrapped, AutoModelForCausalLM.from_pretrained(qwen_dir)], tokenizer=_trainer(qwen_dir).tokenizers[0],
                      reward_func=total_length, train_dataset=dataset, args=_config(2), peft_config=LORA)
    with pytest.raises(ValueError, match="critic_peft_config needs separate critics"):
        IACTrainer(agent_model=qwen_dir, num_agents=2, reward_func=total_length, train_dataset=dataset,
                   args=IACConfig(use_separate_critic=False, output_dir="x", report_to=[]), critic_peft_config=LORA)
    with pytest.raises(ValueError, match="critic_peft_config has 2 entries but there are 1 critics"):
        MAACTrainer(agent_model=qwen_dir, num_agents=2, critic_model=qwen_dir, reward_func=total_length,
                    train_dataset=dataset, args=MAACConfig(output_dir="x", report_to=[]), critic_peft_config=[LORA, LORA])


def test_heterogeneous_agents_get_separate_peft_models(llama_dir, qwen_dir, tmp_path):
    configs = [LoraConfig(r=2, target_modules=["q_proj"]), LoraConfig(r=4, target_modules=["q_proj", "v_proj"])]
    trainer = IACTrainer(agents=[llama_dir, qwen_dir], tokenizer=[_trainer(llama_dir, 1).tokenizers[0], _trainer(qwen_dir, 1).tokenizers[0]],
                         reward_func=total_length, train_dataset=Dataset.from_dict({"prompt": PROMPTS[:2]}), peft_config=configs,
                         args=IACConfig(output_dir="iac", use_separate_critic=False, num_train_epochs=1, max_new_tokens=6,
                                        num_generations=2, per_device_train_batch_size=2, report_to=[], disable_tqdm=True))
    assert trainer.peft_backend == "separate" and [a.peft_config["default"].r for a in trainer.agents] == [2, 4]
    trainer.train()
    trainer.save_model(str(tmp_path / "saved"))
    for i, path in enumerate([llama_dir, qwen_dir]):
        folder = tmp_path / "saved" / f"agent_{i}"
        assert {"adapter_model.safetensors", "adapter_config.json", "value_head.pt"} <= set(os.listdir(folder))
        assert AutoPeftModelForCausalLM.from_pretrained(folder).peft_config["default"].base_model_name_or_path == path
    # the checkpoint loader restores adapters and value heads in place, exactly
    fresh = IACTrainer(agents=[llama_dir, qwen_dir], tokenizer=trainer.tokenizers, reward_func=total_length,
                       train_dataset=Dataset.from_dict({"prompt": PROMPTS[:2]}), peft_config=configs, args=trainer.args)
    fresh._container.load_weights(str(tmp_path / "saved"))
    for old, new in zip(trainer.agents, fresh.agents):
        so, sn = old.state_dict(), new.state_dict()
        assert so.keys() == sn.keys() and all(torch.equal(so[k], sn[k]) for k in so)


def test_dora_adapters_on_a_shared_base_generate_one_agent_at_a_time(qwen_dir):
    trainer = _trainer(qwen_dir, 2, peft_config=LoraConfig(r=2, target_modules=["q_proj"], use_dora=True))
    assert trainer.peft_backend == "shared" and trainer._generate_all_agents(True) is None  # PEFT cannot mix DoRA rows
    before = {k: p.detach().clone() for k, p in _adapters(trainer.agents[1]).items()}
    trainer.train()
    assert any(not torch.equal(before[k], p) for k, p in _adapters(trainer.agents[1]).items())


def test_multi_turn_shared_base_generates_once_per_turn(qwen_dir):
    def transition(prompt, agent_completions, **kw):
        return [f"{prompt} Improve: {c[:20]}" for c in agent_completions]

    trainer = MAGRPOTrainer(agent_model=qwen_dir, num_agents=2, reward_func=total_length, peft_config=LORA,
                            external_transition=transition, train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                            args=_config(2, num_turns=2, joint_mode="cross"))
    peft_model, calls = trainer.agents[0].peft_model, []
    original = peft_model.generate
    peft_model.generate = lambda *a, **kw: calls.append(kw.get("adapter_names")) or original(*a, **kw)
    trainer.train()
    assert trainer.env_step == 2 * (2 * 4 + 8 * 4)  # 2 steps; turn 1: 2 nodes x K^N=4; turn 2: 8 nodes x 4
    assert len(calls) == 2 * 2  # one generate call per turn for both agents
    assert calls[0] == ["agent_0"] * 4 + ["agent_1"] * 4 and calls[1] == ["agent_0"] * 16 + ["agent_1"] * 16
