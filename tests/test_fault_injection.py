"""Seeded fault injection (issue 12): training processes of MAGRPO, IAC, MAAC and MARLHF are SIGKILLed at a
random point of a rollout, an update, a checkpoint write and (MARLHF) pair collection and reward-model training;
what they leave holds only complete checkpoints, and resuming from them ends with exactly the weights of an
uninterrupted run. A full disk during a checkpoint write gives a clear `CheckpointError`, publishes nothing, and
leaves the previous checkpoint intact and resumable.

A fork server keeps 50 trials cheap: this (pytest) process imports torch, transformers and comlrl_hf once and
builds each trainer once, as a fresh process would; every run (the uninterrupted reference, each victim, each
resume) is an `os.fork()` of that untouched state. A victim that reaches its chosen event tells the parent
through a pipe and waits; the parent SIGKILLs it. Children write to their own log file and leave by `os._exit`.

Trials per trainer and phase: `PHASES` (50 in all), times `COMLRL_FAULT_ROUNDS` (default 1); the kill points
come from `random.Random(f"{COMLRL_FAULT_SEED}-{trainer}")` (default seed 4) over the events the reference run
went through."""

import ctypes
import errno
import gc
import json
import logging
import os
import pathlib
import random
import select
import shutil
import signal
import sys
import tempfile
import traceback

import pytest
import torch
from datasets import Dataset
from transformers import AutoTokenizer

from comlrl_hf import IACConfig, IACTrainer, MAACConfig, MAACTrainer, MAGRPOConfig, MAGRPOTrainer
from comlrl_hf.trainers import checkpointing
from comlrl_hf.trainers.preference import MARLHFConfig, MARLHFTrainer
from comlrl_hf.trainers.preference import marlhf as marlhf_module
from comlrl_hf.utils import read_checkpoint_metadata
from comlrl_hf.utils.checkpoint import CheckpointError, list_checkpoints, verify_manifest

from conftest import PROMPTS, length_ratio_reward

ROUNDS = int(os.environ.get("COMLRL_FAULT_ROUNDS", "1"))
SEED = os.environ.get("COMLRL_FAULT_SEED", "4")
# trials per phase of each trainer (50 in all)
PHASES = {
    "magrpo": {"rollout": 4, "update": 4, "checkpoint": 4},
    "iac": {"rollout": 4, "update": 4, "checkpoint": 4},
    "maac": {"rollout": 4, "update": 4, "checkpoint": 4},
    "marlhf": {"pairs": 3, "reward_model": 3, "rollout": 2, "update": 2, "checkpoint": 4},
}
TRIALS = {kind: sum(counts.values()) for kind, counts in PHASES.items()}
# 2 prompts, one per step: 2 steps per epoch, 2 epochs
COMMON = dict(output_dir="out", num_train_epochs=2, max_new_tokens=4, per_device_train_batch_size=1, report_to=[],
              disable_tqdm=True, logging_steps=1, agent_learning_rate=1e-3)
# MARLHF: 2 stage checkpoints + 1 RL epoch, the newest 2 kept (so a kill can also land in a rotation)
TRAIN_KW = {"marlhf": dict(checkpoint_interval=1, checkpoint_total_limit=2)}
FINAL = {"marlhf": ["checkpoint-2", "checkpoint-3"]}


@pytest.fixture()
def workspace(tmp_path):
    """Where the trial runs write: a memory file system when there is one (fsync is free there, and these
    tests leave the disk to whoever else uses the machine), else tmp_path. Removed afterwards."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else str(tmp_path)
    folder = tempfile.mkdtemp(prefix="comlrl-faults-", dir=base)
    yield pathlib.Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


def _build(kind, dirs):
    dataset = Dataset.from_dict({"prompt": PROMPTS[:2]})
    if kind == "magrpo":
        return MAGRPOTrainer(agents=list(dirs), reward_func=length_ratio_reward, train_dataset=dataset,
                             args=MAGRPOConfig(**COMMON))
    tokenizers = [AutoTokenizer.from_pretrained(d) for d in dirs]
    if kind == "iac":
        return IACTrainer(agents=list(dirs), tokenizer=tokenizers, critics=list(dirs), reward_func=length_ratio_reward,
                          train_dataset=dataset, args=IACConfig(use_separate_critic=True, num_generations=2, **COMMON))
    if kind == "maac":
        return MAACTrainer(agents=list(dirs), tokenizer=tokenizers, critic_model=dirs[1], reward_func=length_ratio_reward,
                           train_dataset=dataset, args=MAACConfig(critic_type="q", num_generations=2, **COMMON))
    return MARLHFTrainer(agent_model=dirs[1], num_agents=2, reward_func=length_ratio_reward, train_dataset=dataset,
                         args=MARLHFConfig(**{**COMMON, "num_train_epochs": 1}, preference_num_candidates=4,
                                           preference_pairs_per_sample=3, reward_learning_rate=1e-3,
                                           reward_train_batch_size=2, reward_num_train_epochs=2,
                                           reward_model_device=None))


def _weights(trainer):
    models = list(trainer.agents) + list(trainer._container.critics or [])
    models += [trainer.reward_model] if getattr(trainer, "reward_model", None) is not None else []
    return [t.detach().clone() for m in models for t in m.state_dict().values()]


# ---- the events of a run ----

def _install(trainer, kill_at, at_kill_point):
    """Count the events of a run (`phase:what`); call `at_kill_point()` instead of running event `kill_at`."""
    events = []

    def wrap(owner, attr, label):
        original = getattr(owner, attr)

        def wrapper(*args, **kwargs):
            name = label() if callable(label) else label
            if name is not None:
                events.append(name)
                if len(events) == kill_at:
                    at_kill_point()
            return original(*args, **kwargs)

        setattr(owner, attr, wrapper)

    wrap(trainer, "rollout", "rollout")
    wrap(trainer, "_clip_grad_norm", "update")  # between backward and optimizer.step
    wrap(trainer, "save_model", "checkpoint:weights")  # the staging folder exists, empty
    wrap(trainer, "_save_optimizer_and_scheduler", "checkpoint:optimizer")
    wrap(trainer, "_save_rng_state", "checkpoint:rng")
    wrap(trainer, "_save_extra_state", "checkpoint:extra")
    wrap(checkpointing, "file_manifest", "checkpoint:manifest")
    wrap(checkpointing, "write_json", "checkpoint:metadata")
    wrap(checkpointing, "publish", "checkpoint:publish")  # fsynced, not yet renamed
    wrap(checkpointing, "retire", "checkpoint:retire")  # the next one published, the oldest not yet removed
    if isinstance(trainer, MARLHFTrainer):
        wrap(trainer, "_roll_out", lambda: None if trainer._use_reward_model else "pairs:sample")
        wrap(marlhf_module, "select_pairs", "pairs:select")
        wrap(marlhf_module, "load_reward_model", "reward_model:load")
        wrap(marlhf_module, "bradley_terry_loss", "reward_model:step")
    return events


def _kill_points(events, phases, rng):
    """`phases[phase]` events of each phase, distinct within a phase while its events last."""
    points = []
    for phase, wanted in phases.items():
        pool = [(n, label) for n, label in enumerate(events, 1) if label.split(":")[0] == phase]
        points += rng.sample(pool, min(wanted, len(pool))) + [rng.choice(pool) for _ in range(wanted - len(pool))]
    return sorted(points)


# ---- the fork server ----

def _child_output(path):
    """Point fds 1/2, sys.stdout/err and every logging stream at `path` (not pytest's capture files)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = sys.stderr = open(1, "w", buffering=1, closefd=False)
    loggers = [logging.getLogger()] + [v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger)]
    for logger in loggers:
        for handler in logger.handlers:
            if type(handler) is logging.StreamHandler:
                handler.stream = sys.stderr  # not setStream: it would flush the parent's stream from here


def _fork(task, folder, timeout=300):
    """Run `task(at_kill_point)` in a forked child working in `folder`. Returns ("killed", events reached) when
    the child called `at_kill_point()` and was SIGKILLed, ("done", task's JSON result), or fails the test."""
    os.makedirs(folder, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            gc.freeze()  # the parent's objects: Trainer's gc.collect() at the end of train() skips them
            _child_output(os.path.join(folder, "child.log"))
            torch.set_num_threads(1)
            os.chdir(folder)

            def at_kill_point():
                os.write(write_end, b"K")
                while True:
                    signal.pause()  # the parent SIGKILLs us here

            result = task(at_kill_point)
            os.write(write_end, b"D" + json.dumps(result).encode())
            code = 0
        except BaseException:
            traceback.print_exc()
            os.write(write_end, b"E" + traceback.format_exc()[-3000:].encode())
        finally:
            os._exit(code)
    os.close(write_end)
    data = b""
    try:
        while True:
            ready, _, _ = select.select([read_end], [], [], timeout)
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail(f"child in {folder} neither finished nor reached its kill point in {timeout} s")
            chunk = os.read(read_end, 1 << 16)
            data += chunk
            if data[:1] == b"K":
                os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
                return "killed", None
            if not chunk:
                break
    finally:
        os.close(read_end)
    _, status = os.waitpid(pid, 0)
    if data[:1] == b"D" and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return "done", json.loads(data[1:])
    pytest.fail(f"child in {folder} failed (status {status}):\n{data[1:].decode(errors='replace')}")


def _train_task(trainer, kind, kill_at=0, resume=False):
    def task(at_kill_point):
        events = _install(trainer, kill_at, at_kill_point)
        published = list_checkpoints("ck")
        trainer.train(resume_from_checkpoint=True if resume and published else None, checkpoint_dir="ck",
                      **TRAIN_KW.get(kind, {"checkpoint_interval": 1}))
        torch.save(_weights(trainer), "weights.pt")
        return {"events": events, "env_step": trainer.env_step, "global_step": trainer.state.global_step,
                "resumed_from": os.path.basename(published[-1]) if resume and published else None}
    return task


@pytest.mark.parametrize("kind", list(TRIALS))
def test_sigkill_at_random_points_then_resume_matches_an_uninterrupted_run(kind, llama_dir, qwen_dir, workspace,
                                                                          record_property):
    trainer = _build(kind, [llama_dir, qwen_dir])  # never trained here: every run forks from this state
    outcome, reference = _fork(_train_task(trainer, kind), str(workspace / "reference"))
    events = reference["events"]
    assert {e.split(":")[0] for e in events} == set(PHASES[kind]), events
    expected = torch.load(workspace / "reference" / "weights.pt", weights_only=True)
    final = FINAL.get(kind, ["checkpoint-1", "checkpoint-2"])
    assert sorted(os.listdir(workspace / "reference" / "ck")) == final

    rng = random.Random(f"{SEED}-{kind}")
    points = [p for _ in range(ROUNDS) for p in _kill_points(events, PHASES[kind], rng)]
    trials = survived = 0
    outcomes = []
    for n, (kill_at, label) in enumerate(points):
        folder = workspace / f"trial-{n}"
        ckpt_dir = folder / "ck"
        trials += 1
        record_property("fault_trials", trials)  # recorded as it goes: a failing trial still counts as run
        outcome, _ = _fork(_train_task(trainer, kind, kill_at=kill_at), str(folder))
        assert outcome == "killed", (kind, kill_at, label)
        # never a partial checkpoint under a checkpoint name; every published one verifies
        published = list_checkpoints(ckpt_dir)
        if ckpt_dir.exists():
            visible = sorted(p for p in os.listdir(ckpt_dir) if p.startswith("checkpoint-"))
            assert visible == sorted(os.path.basename(p) for p in published), (label, os.listdir(ckpt_dir))
        for path in published:
            verify_manifest(path, read_checkpoint_metadata(path)["manifest"])

        outcome, resumed = _fork(_train_task(trainer, kind, resume=True), str(folder))
        weights = torch.load(folder / "weights.pt", weights_only=True)
        same = len(weights) == len(expected) and all(torch.equal(a, b) for a, b in zip(expected, weights))
        assert same, f"{kind} trial {n} (killed at event {kill_at}, {label}): resumed weights differ"
        assert (resumed["env_step"], resumed["global_step"]) == (reference["env_step"], reference["global_step"])
        assert sorted(os.listdir(ckpt_dir)) == final  # and no staging or half-deleted folder left
        survived += 1
        record_property("faults_survived", survived)
        outcomes.append(f"{kill_at}:{label}:{len(published)} left, resumed from {resumed['resumed_from']}")
        shutil.rmtree(folder)  # keeps /dev/shm small; a failing trial stops the test before this
    print(f"{kind} fault trials:", outcomes)
    assert trials == survived == TRIALS[kind] * ROUNDS
    assert any("from None" in o for o in outcomes) and any("from checkpoint-" in o for o in outcomes)  # both paths ran


# ---- a full disk during a checkpoint write ----

def _magrpo(dirs):
    return MAGRPOTrainer(agents=list(dirs), reward_func=length_ratio_reward,
                         train_dataset=Dataset.from_dict({"prompt": PROMPTS[:2]}), args=MAGRPOConfig(**COMMON))


def _full_disk_writer(original, error, calls_before, path_index=1):
    """`original`, except that from call `calls_before + 1` on it writes half the file, then fails as a full disk
    makes that writer fail (the error types a real tmpfs gives: see `test_a_real_full_tmpfs...`)."""
    calls = []

    def wrapper(*args, **kwargs):
        calls.append(args)
        original(*args, **kwargs)
        if len(calls) > calls_before:
            path = os.fspath(args[path_index])
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) // 2)
            raise error
    return wrapper


def _check_after_disk_full(message, ck, dirs, reference_weights):
    assert f"could not write checkpoint {os.path.join(ck, 'checkpoint-2')}" in message, message
    assert "was removed" in message and "bytes free on its file system" in message, message
    assert sorted(os.listdir(ck)) == ["checkpoint-1"]  # nothing published, no staging folder left
    verify_manifest(os.path.join(ck, "checkpoint-1"), read_checkpoint_metadata(os.path.join(ck, "checkpoint-1"))["manifest"])
    resumed = _magrpo(dirs)
    resumed.train(resume_from_checkpoint=os.path.join(ck, "checkpoint-1"), checkpoint_dir="ck-resumed")
    assert all(torch.equal(a, b) for a, b in zip(reference_weights, _weights(resumed)))
    assert resumed.state.global_step == 4


@pytest.mark.parametrize("writer", ["agent-weights", "optimizer", "metadata"])
def test_disk_full_during_a_checkpoint_write_is_a_clear_error_and_keeps_the_previous_checkpoint(
        writer, llama_dir, qwen_dir, monkeypatch):
    import safetensors
    import transformers.modeling_utils

    dirs = [llama_dir, qwen_dir]
    reference = _magrpo(dirs)
    reference.train()
    trainer = _magrpo(dirs)
    with monkeypatch.context() as m:  # not monkeypatch.undo(): it would also undo conftest's chdir
        if writer == "agent-weights":  # 2 agents' model.safetensors per checkpoint: the 3rd call is checkpoint-2's
            error = safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
            m.setattr(transformers.modeling_utils, "safe_save_file",
                      _full_disk_writer(transformers.modeling_utils.safe_save_file, error, 2))
            cause = "SafetensorError: Error while serializing: I/O error: No space left on device"
        elif writer == "optimizer":  # torch.save: optimizer.pt, scheduler.pt, rng_state.pth per checkpoint
            error = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
            m.setattr(torch, "save", _full_disk_writer(torch.save, error, 3))
            cause = "RuntimeError: [enforce fail at inline_container.cc:672]"
        else:
            error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            m.setattr(checkpointing, "write_json", _full_disk_writer(checkpointing.write_json, error, 1, path_index=0))
            cause = "ENOSPC, OSError: [Errno 28] No space left on device"
        with pytest.raises(CheckpointError) as raised:
            trainer.train(checkpoint_dir="ck")
        assert raised.value.__cause__ is error and cause in str(raised.value)
    _check_after_disk_full(str(raised.value), "ck", dirs, _weights(reference))


def _mount_private_tmpfs(path, size):
    """In this (forked, single-threaded) child only: a new mount namespace holding a tmpfs of `size` bytes at
    `path`; it disappears with the process. Raises OSError where namespaces or mounts are not allowed."""
    libc = ctypes.CDLL(None, use_errno=True)
    CLONE_NEWNS, CLONE_NEWUSER, MS_REC, MS_PRIVATE = 0x20000, 0x10000000, 0x4000, 0x40000
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWNS) != 0:  # not root: a user namespace in which we are root
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare")
        for file, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{file}", "w") as f:
                f.write(text)
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    if libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", 0, f"size={size}".encode()) != 0:
        raise OSError(ctypes.get_errno(), f"mount tmpfs on {path}")


def test_a_real_full_tmpfs_during_a_checkpoint_write(llama_dir, qwen_dir, tmp_path):
    """A tmpfs 1.5 checkpoints large (mounted in a private mount namespace of a forked child): checkpoint-2 runs
    out of space, the run stops with a CheckpointError, and checkpoint-1 is intact and resumes exactly."""
    dirs = [llama_dir, qwen_dir]
    reference = _magrpo(dirs)
    reference.train(checkpoint_dir="reference")
    size = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk("reference/checkpoint-1")
               for f in files)
    trainer = _magrpo(dirs)
    disk = tmp_path / "disk"
    disk.mkdir()

    def task(_):
        try:
            _mount_private_tmpfs(str(disk), (size * 3 // 2) // 4096 * 4096)
        except OSError as error:
            return {"skip": str(error)}
        try:
            trainer.train(checkpoint_dir=str(disk / "ck"))
        except CheckpointError as error:
            ck = disk / "ck"
            shutil.copytree(ck, tmp_path / "ck")  # out of the tmpfs, which dies with this process
            cause = error.__cause__
            return {"message": str(error), "cause": f"{type(cause).__name__}: {cause}", "listing": sorted(os.listdir(ck))}
        return {"message": None}

    _, result = _fork(task, str(tmp_path / "child"))
    if "skip" in result:
        pytest.skip(f"no private tmpfs here: {result['skip']}")
    assert result["message"] is not None, "the run did not fill the tmpfs"
    print("full tmpfs:", result["cause"], "->", result["message"])
    assert result["listing"] == ["checkpoint-1"]
    assert "the disk looks full" in result["message"], result["message"]
    message = result["message"].replace(str(disk / "ck"), "ck")  # checked against the copy
    _check_after_disk_full(message, "ck", dirs, _weights(reference))
