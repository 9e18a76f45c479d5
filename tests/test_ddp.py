"""Data-parallel training: a real 2-process run on CPU (gloo) against the 1-process run with the same global
batch, exact resume under 2 processes, and the pieces that make it work (sharded batches, seeded generation)."""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from accelerate.data_loader import BatchSamplerShard

from comlrl_hf.rollout.generation import generate_completions
from comlrl_hf.rollout.seeded import generate_per_prompt
from comlrl_hf.trainers.base import PromptBatchSampler

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ddp_worker  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


KINDS = ("grpo", "iac", "iac-shared", "maac", "marlhf")  # one torchrun launch runs them all (start-up paid once)


@pytest.fixture(scope="module")
def two_process_runs(llama_dir, qwen_dir, tmp_path_factory):
    """Every KIND trained by 2 CPU processes (gloo), then resumed from checkpoint-1 (tests/ddp_worker.py)."""
    out = tmp_path_factory.mktemp("ddp")
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(_free_port()), os.path.join(HERE, "ddp_worker.py"), str(out), str(llama_dir),
               str(qwen_dir), ",".join(KINDS)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return out


def test_agents_that_differ_between_processes_start_as_process_0s(two_process_runs, llama_dir):
    from transformers import AutoModelForCausalLM

    sums = [json.load(open(two_process_runs / f"broadcast_rank{r}.json")) for r in range(2)]
    loaded = [p.double().sum().item() for p in AutoModelForCausalLM.from_pretrained(llama_dir).parameters()]
    assert sums[0] == sums[1] and sums[0][: len(loaded)] == loaded  # process 1's shifted weights were replaced


def _check_two_process_run(out, kind, dirs, tmp_path, weight_tolerance, extra_keys=()):
    """What every trainer must show: identical processes, bitwise resume, and the 1-process run with the same
    global batch (same samples, rewards and env_step; weights within float-summation tolerance). Logged
    per-token means (entropy) are means of per-process means, so they match only when completions are equally
    long: `extra_keys` lists those that do here."""
    out = out / kind
    ranks = [torch.load(out / f"weights_rank{r}.pt", weights_only=True) for r in range(2)]
    logs = [json.load(open(out / f"logs_rank{r}.json")) for r in range(2)]
    # the two processes hold bitwise identical agents and critics (gradients averaged, same optimizer steps)
    for run in ("full", "resumed"):
        assert all(torch.equal(ranks[0][run][k], ranks[1][run][k]) for k in ranks[0][run])
    # resume under 2 processes (from checkpoint-1, per-process RNG files) is bitwise exact
    assert all(torch.equal(ranks[0]["full"][k], ranks[0]["resumed"][k]) for k in ranks[0]["full"])
    opt_full, opt_resumed = ranks[0]["full_optimizer"], ranks[0]["resumed_optimizer"]
    assert opt_full["state"] and opt_full["state"].keys() == opt_resumed["state"].keys()
    assert all(torch.equal(opt_full["state"][k][n], opt_resumed["state"][k][n]) for k in opt_full["state"] for n in opt_full["state"][k])
    assert logs[0]["full"] == logs[0]["resumed"] and logs[0]["env_step"][0] == logs[0]["env_step"][1]
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(logs[0]["files"]) and "rng_state.pth" not in logs[0]["files"]
    assert sorted(os.listdir(out / "full")) == logs[0]["checkpoints"]  # written once, by process 0

    # one process, same global batch, same seeded samples
    os.chdir(tmp_path)
    single = ddp_worker.build(kind, dirs, 1)
    single.train()
    expected = ddp_worker.snapshot(single)
    initial = ddp_worker.snapshot(ddp_worker.build(kind, dirs, 1))
    assert expected.keys() == ranks[0]["full"].keys()
    moved = max((expected[k] - initial[k]).abs().max().item() for k in initial)
    gap = max((ranks[0]["full"][k] - expected[k]).abs().max().item() for k in expected)
    assert moved > 1e-3 and gap < weight_tolerance, (moved, gap)  # float-summation order only
    one = ddp_worker.step_logs(single)
    assert len(one) == len(logs[0]["full"]) and single.env_step == logs[0]["env_step"][0]
    for a, b in zip(logs[0]["full"], one):
        assert a["env_step"] == b["env_step"] and a["reward"] == pytest.approx(b["reward"], abs=1e-5)  # same samples
        for key in ("grad_norm", "agent_0/grad_norm", "agent_1/grad_norm") + extra_keys:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5), key
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
    return single, logs[0]


def test_two_process_magrpo_equals_one_process_and_resumes_exactly(two_process_runs, llama_dir, qwen_dir, tmp_path):
    dirs = [llama_dir, qwen_dir]
    single, logs = _check_two_process_run(two_process_runs, "grpo", dirs, tmp_path, 2e-5, ("agent_0/entropy",))  # observed ~2e-6
    assert logs["env_step"] == [64, 64] and len(logs["full"]) == 4
    # a stateful reward function's state is saved per process and each process gets its own back
    states = [json.load(open(two_process_runs / "grpo" / f"logs_rank{r}.json"))["reward_state"] for r in range(2)]
    for full, resumed in states:
        assert full == resumed and len(full["prompts"]) == 32  # 4 steps x 2 prompts x 4 joint actions
    assert states[0][0] != states[1][0]
    # a 2-process checkpoint is refused by one process before anything is restored
    from comlrl_hf.utils import CheckpointError

    other = ddp_worker.build("grpo", dirs, 1)
    with pytest.raises(CheckpointError, match=r"written by 2 process\(es\), this run has 1"):
        other.train(resume_from_checkpoint=str(two_process_runs / "grpo" / "full" / "checkpoint-1"),
                    checkpoint_dir=str(tmp_path / "other"))
    assert other.env_step == 0


@pytest.mark.parametrize("kind", ["iac", "iac-shared", "maac"])
def test_two_process_actor_critic_equals_one_process_and_resumes_exactly(kind, two_process_runs, llama_dir, qwen_dir, tmp_path):
    """Critics (separate, value heads on the actors, centralized Q) are averaged like the agents; advantages are
    z-scored over the global batch (each process holds 2 of its 4 rows)."""
    # AdamW normalises tiny critic gradients, so summation-order noise reaches ~2e-5 (maac observed 2.3e-5 after the
    # weights moved 4e-3); a real error (advantages z-scored per process) moved them 7.9e-3
    single, logs = _check_two_process_run(two_process_runs, kind, [llama_dir, qwen_dir], tmp_path, 1e-4)
    assert logs["env_step"] == [16, 16]
    value_loss = "critic/value_loss" if kind == "maac" else "agent_0/value_loss"
    for a, b in zip(logs["full"], ddp_worker.step_logs(single)):
        assert a[value_loss] == pytest.approx(b[value_loss], rel=1e-4, abs=1e-6)


def test_two_process_marlhf_equals_one_process_and_resumes_exactly(two_process_runs, llama_dir, qwen_dir, tmp_path):
    """Pairs collected on each process's shard and gathered in prompt order; the reward model trained on every
    process from them (resumed from the pairs-only checkpoint-1, so the resumed run trains it again)."""
    single, logs = _check_two_process_run(two_process_runs, "marlhf", [llama_dir, qwen_dir], tmp_path, 2e-5)
    assert logs["checkpoints"] == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]  # pairs, reward model, epoch
    assert logs["pairs"] == single._stage["pairs"] and len(logs["pairs"]) == 8  # 4 prompts x 2 pairs, in order
    assert [p["item"] for p in logs["pairs"]] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_buckets_keep_order_and_split_by_size_and_dtype(monkeypatch):
    from comlrl_hf.trainers import distributed

    monkeypatch.setattr(distributed, "_BUCKET_BYTES", 40)
    tensors = [torch.zeros(4), torch.zeros(4), torch.zeros(4), torch.zeros(20), torch.zeros(2, dtype=torch.float64),
               torch.zeros(1)]
    buckets = list(distributed._buckets(tensors, key=lambda t: t))
    sizes = [[t.numel() for t in b] for b in buckets]
    assert sizes == [[4, 4], [4], [20], [2], [1]]  # 32 B + 16 B > 40; an 80 B tensor alone; a dtype change splits
    assert [id(t) for b in buckets for t in b] == [id(t) for t in tensors]  # every tensor once, in order


def test_sharded_prompt_batches_are_the_one_process_batch_split_in_order():
    for repeats, group in ((1, 1), (2, 1), (2, 2), (1, 3)):
        one = list(PromptBatchSampler(12, 4, shuffle=True, seed=3, group_size=group, repeats=repeats))
        two = PromptBatchSampler(12, 2, shuffle=True, seed=3, group_size=group, repeats=repeats, world_size=2)
        shards = [list(BatchSamplerShard(two, num_processes=2, process_index=r)) for r in range(2)]
        assert len(shards[0]) == len(shards[1]) == len(one) == len(two) // 2
        assert [a + b for a, b in zip(*shards)] == one
    # a last global batch too small for every process is dropped (10 prompts, 2 x 2 per step: 2 steps)
    two = PromptBatchSampler(10, 2, shuffle=False, seed=0, world_size=2)
    assert list(two) == [[0, 1], [2, 3], [4, 5], [6, 7]] and len(two) == 4


def test_seeded_generation_does_not_depend_on_the_batch(qwen_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = AutoModelForCausalLM.from_pretrained(qwen_dir), AutoTokenizer.from_pretrained(qwen_dir)
    kwargs = dict(max_new_tokens=6, do_sample=True, temperature=1.0, top_p=1.0, top_k=0)
    both = generate_per_prompt(model, tok, ["a short one", "a much longer prompt than the first"], 3, kwargs, [11, 22])
    alone = generate_per_prompt(model, tok, ["a much longer prompt than the first"], 3, kwargs, [22])
    assert both.completions[3:] == alone.completions
    width = alone.completion_ids.shape[1]
    assert torch.equal(both.completion_ids[3:, :width], alone.completion_ids)
    assert torch.equal(both.completion_mask[3:, :width], alone.completion_mask)
    assert torch.equal(both.prompt_ids[3:], alone.prompt_ids) and torch.equal(both.prompt_mask[3:], alone.prompt_mask)
    torch.manual_seed(0)
    state = torch.random.get_rng_state()
    generate_per_prompt(model, tok, ["x"], 2, kwargs, [5])
    assert torch.equal(state, torch.random.get_rng_state())  # the global stream is untouched
    # one prompt, plain generation under the same seed: the same samples
    torch.manual_seed(22)
    plain = generate_completions(model, tok, ["a much longer prompt than the first"], 3, kwargs)
    assert plain.completions == alone.completions
