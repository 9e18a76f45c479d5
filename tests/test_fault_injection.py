"""Seeded fault injection: a MAGRPO training process is SIGKILLed at a random point of a rollout, of an
update, and of a checkpoint write; what it leaves holds only complete checkpoints, and resuming from them
ends with exactly the weights of an uninterrupted run.

Every trial starts a fresh Python process (about 10 s on 2 cores), so `make test` runs one round (one trial
per phase: 3 trials). `COMLRL_FAULT_ROUNDS=17` runs 51 (a soak; minutes). The kill points come from
`random.Random(COMLRL_FAULT_SEED, default 4)` over the events an uninterrupted run goes through."""

import os
import random
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from datasets import Dataset

from comlrl_hf import MAGRPOConfig, MAGRPOTrainer
from comlrl_hf.trainers import checkpointing
from comlrl_hf.utils import read_checkpoint_metadata
from comlrl_hf.utils.checkpoint import list_checkpoints, verify_manifest

from conftest import PROMPTS, length_ratio_reward

ROUNDS = int(os.environ.get("COMLRL_FAULT_ROUNDS", "1"))
SEED = int(os.environ.get("COMLRL_FAULT_SEED", "4"))
EPOCHS = 2

HARNESS = textwrap.dedent(
    """
    import os

    from comlrl_hf.trainers import checkpointing


    def install(trainer, kill_at, patch):
        # Count the events of a run (phase:what); SIGKILL the process instead of running event number kill_at.
        events = []

        def wrap(owner, attr, label):
            original = getattr(owner, attr)

            def wrapper(*args, **kwargs):
                events.append(label)
                if len(events) == kill_at:
                    os.kill(os.getpid(), 9)
                return original(*args, **kwargs)

            patch(owner, attr, wrapper)

        wrap(trainer, "rollout", "rollout")
        wrap(trainer, "_clip_grad_norm", "update")  # between backward and optimizer.step
        wrap(trainer, "save_model", "checkpoint:weights")
        wrap(trainer, "_save_optimizer_and_scheduler", "checkpoint:optimizer")
        wrap(checkpointing, "write_json", "checkpoint:metadata")
        wrap(checkpointing, "publish", "checkpoint:publish")
        return events
    """
)

SCRIPT = HARNESS + textwrap.dedent(
    """
    import sys
    import torch
    torch.set_num_threads(1)
    from datasets import Dataset
    from comlrl_hf import MAGRPOConfig, MAGRPOTrainer
    from conftest import PROMPTS, length_ratio_reward

    kill_at, ckpt_dir, dirs = int(sys.argv[1]), sys.argv[2], sys.argv[3:5]
    trainer = MAGRPOTrainer(agents=dirs, reward_func=length_ratio_reward,
                            train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                            args=MAGRPOConfig(output_dir="out", num_train_epochs=%d, max_new_tokens=4, report_to=[],
                                              agent_learning_rate=1e-3, disable_tqdm=True, logging_steps=1))
    install(trainer, kill_at, setattr)
    trainer.train(checkpoint_dir=ckpt_dir, checkpoint_interval=1)
    """ % EPOCHS
)


def _build(dirs):
    return MAGRPOTrainer(agents=list(dirs), reward_func=length_ratio_reward,
                         train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                         args=MAGRPOConfig(output_dir="out", num_train_epochs=EPOCHS, max_new_tokens=4, report_to=[],
                                           agent_learning_rate=1e-3, disable_tqdm=True, logging_steps=1))


def _weights(trainer):
    return [p.detach().clone() for a in trainer.agents for p in a.state_dict().values()]


def _kill_points(events, rounds, seed):
    """One event per phase (rollout, update, checkpoint write) per round, drawn with a seeded generator."""
    rng = random.Random(seed)
    phases = {}
    for number, label in enumerate(events, 1):
        phases.setdefault(label.split(":")[0], []).append((number, label))
    return [rng.choice(phases[phase]) for _ in range(rounds) for phase in ("rollout", "update", "checkpoint")]


def test_sigkill_at_random_points_then_resume_matches_an_uninterrupted_run(llama_dir, qwen_dir, tmp_path, monkeypatch,
                                                                          record_property):
    namespace = {}
    exec(HARNESS, namespace)
    reference = _build([llama_dir, qwen_dir])
    with monkeypatch.context() as m:
        events = namespace["install"](reference, 0, m.setattr)
        reference.train(checkpoint_dir="reference", checkpoint_interval=1)
    assert checkpointing.write_json.__name__ == "write_json"  # the module patch was undone
    expected = _weights(reference)
    assert {e.split(":")[0] for e in events} == {"rollout", "update", "checkpoint"}

    script = tmp_path / "victim.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])}
    trials, survived, outcomes = 0, 0, []
    for n, (kill_at, label) in enumerate(_kill_points(events, ROUNDS, SEED)):
        ckpt_dir = tmp_path / f"trial-{n}"
        result = subprocess.run([sys.executable, str(script), str(kill_at), str(ckpt_dir), llama_dir, qwen_dir],
                                env=env, capture_output=True, text=True, timeout=300)
        trials += 1
        record_property("fault_trials", trials)  # recorded as it goes: a failing trial still counts as run
        assert result.returncode == -signal.SIGKILL, (label, result.stderr[-2000:])
        # never a partial checkpoint under a checkpoint name; every published one verifies
        published = list_checkpoints(ckpt_dir)
        if ckpt_dir.exists():
            visible = sorted(p for p in os.listdir(ckpt_dir) if p.startswith("checkpoint-"))
            assert visible == sorted(os.path.basename(p) for p in published), (label, os.listdir(ckpt_dir))
        for path in published:
            verify_manifest(path, read_checkpoint_metadata(path)["manifest"])

        resumed = _build([llama_dir, qwen_dir])
        resumed.train(resume_from_checkpoint=True if published else None, checkpoint_dir=str(ckpt_dir),
                      checkpoint_interval=1)
        same = all(torch.equal(a, b) for a, b in zip(expected, _weights(resumed)))
        assert same, f"trial {n} (killed at event {kill_at}, {label}): resumed weights differ"
        assert resumed.env_step == reference.env_step and resumed.state.global_step == reference.state.global_step
        assert sorted(os.listdir(ckpt_dir)) == [f"checkpoint-{k}" for k in range(1, EPOCHS + 1)]
        survived += 1
        record_property("faults_survived", survived)
        outcomes.append(f"{kill_at}:{label}:{len(published)} checkpoint(s) left")
    print("fault trials:", outcomes)
    assert trials == survived == 3 * ROUNDS
