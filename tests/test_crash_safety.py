"""A training process killed with SIGKILL (while training, and at several points of a checkpoint write)
leaves only complete checkpoints, and resume succeeds from what is left."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from datasets import Dataset

from comlrl_hf import MAGRPOConfig, MAGRPOTrainer
from comlrl_hf.utils import read_checkpoint_metadata
from comlrl_hf.utils.checkpoint import list_checkpoints, verify_manifest

from conftest import PROMPTS, length_ratio_reward

SCRIPT = textwrap.dedent(
    """
    import os, sys
    import torch
    torch.set_num_threads(1)
    from datasets import Dataset
    from comlrl_hf import MAGRPOConfig, MAGRPOTrainer
    from comlrl_hf.trainers import checkpointing
    from conftest import PROMPTS, length_ratio_reward

    point, ckpt_dir = sys.argv[1], sys.argv[2]
    dirs = sys.argv[3:5]

    def die(*_, **__):
        os.kill(os.getpid(), 9)

    def after(n, original):
        # `original`, except that its n-th call kills the process instead
        calls = []
        def wrapper(*args, **kwargs):
            calls.append(1)
            if len(calls) == n:
                die()
            return original(*args, **kwargs)
        return wrapper

    trainer = MAGRPOTrainer(agents=dirs, reward_func=length_ratio_reward,
                            train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                            args=MAGRPOConfig(output_dir="out", num_train_epochs=4, max_new_tokens=4, report_to=[],
                                              disable_tqdm=True, logging_steps=1))
    if point == "training":  # a rollout of epoch 3, after checkpoints 1 and 2
        trainer.rollout = after(5, trainer.rollout)
    elif point == "agent-weights":  # second checkpoint: its staging folder holds part of the files
        trainer._save_optimizer_and_scheduler = after(2, trainer._save_optimizer_and_scheduler)
    elif point == "metadata":  # second checkpoint: everything written but comlrl_state.json
        checkpointing.write_json = after(2, checkpointing.write_json)
    elif point == "publish":  # second checkpoint: fsynced, not yet renamed
        checkpointing.publish = after(2, checkpointing.publish)
    elif point == "rotation":  # third checkpoint published; the oldest renamed away but not yet deleted
        def half_retire(path):
            os.replace(path, os.path.join(os.path.dirname(path), ".del-" + os.path.basename(path) + "-x"))
            die()
        checkpointing.retire = half_retire
    trainer.train(checkpoint_dir=ckpt_dir, checkpoint_interval=1, checkpoint_total_limit=2)
    """
)


@pytest.mark.parametrize(
    "point, expected",
    [
        ("training", ["checkpoint-1", "checkpoint-2"]),
        ("agent-weights", ["checkpoint-1"]),
        ("metadata", ["checkpoint-1"]),
        ("publish", ["checkpoint-1"]),
        ("rotation", ["checkpoint-2", "checkpoint-3"]),
    ],
)
def test_sigkill_leaves_only_complete_checkpoints(point, expected, llama_dir, qwen_dir, tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])}
    ckpt_dir = tmp_path / "ck"
    result = subprocess.run([sys.executable, str(script), point, str(ckpt_dir), llama_dir, qwen_dir],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]

    published = [os.path.basename(p) for p in list_checkpoints(ckpt_dir)]
    visible = sorted(n for n in os.listdir(ckpt_dir) if n.startswith("checkpoint-"))
    assert visible == published  # nothing half-written under a checkpoint name
    assert published == expected
    for path in list_checkpoints(ckpt_dir):
        verify_manifest(path, read_checkpoint_metadata(path)["manifest"])

    resumed = MAGRPOTrainer(agents=[llama_dir, qwen_dir], reward_func=length_ratio_reward,
                            train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                            args=MAGRPOConfig(output_dir="out", num_train_epochs=4, max_new_tokens=4, report_to=[],
                                              disable_tqdm=True, logging_steps=1))
    resumed.train(resume_from_checkpoint=True, checkpoint_dir=str(ckpt_dir), checkpoint_interval=1,
                  checkpoint_total_limit=2)
    assert resumed.state.global_step == 8 and resumed.env_step == 64
    assert sorted(os.listdir(ckpt_dir)) == ["checkpoint-3", "checkpoint-4"]  # stale staging folders are gone
