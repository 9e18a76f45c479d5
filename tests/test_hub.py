"""push_to_hub against `huggingface_hub` with its HTTP layer intercepted (no network): the exact files and
paths each layout would upload, the model cards, checkpoint pushes, and loading a pushed agent back."""

import base64
import json
import os

import httpx2
import pytest
import torch
from datasets import Dataset
from huggingface_hub.utils import _http
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM

from comlrl_hf import MAGRPOConfig, MAGRPOTrainer

from conftest import PROMPTS

LORA = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
AGENT_FILES = {"README.md", "adapter_config.json", "adapter_model.safetensors", "tokenizer.json",
               "tokenizer_config.json", "chat_template.jinja"}


def total_length(*completions):
    return [float(sum(len(c) for c in joint)) / 10 for joint in zip(*completions)]


class FakeHub:
    """Answers the Hub API calls an upload makes and records every commit: {repo: [{path: bytes}]}."""

    def __init__(self):
        self.created, self.commits, self.messages = [], {}, {}

    def __call__(self, request):
        path, body = request.url.path, request.content
        if path == "/api/repos/create":
            self.created.append(json.loads(body)["name"])
            return httpx2.Response(200, json={"url": f"https://huggingface.co/me/{json.loads(body)['name']}"})
        if path == "/api/validate-yaml":
            return httpx2.Response(200, json={"errors": [], "warnings": []})
        if "/preupload/" in path:  # "regular" uploads carry the bytes inside the commit call (no LFS/Xet)
            files = json.loads(body)["files"]
            return httpx2.Response(200, json={"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]})
        if "/commit/" in path:
            repo = "/".join(path.split("/")[3:5])
            lines = [json.loads(line) for line in body.decode().splitlines() if line]
            files = {e["value"]["path"]: base64.b64decode(e["value"]["content"]) for e in lines if e["key"] == "file"}
            self.commits.setdefault(repo, []).append(files)
            self.messages.setdefault(repo, []).append(lines[0]["value"]["summary"])
            return httpx2.Response(200, json={"commitUrl": f"https://huggingface.co/{repo}/commit/{'a' * 40}", "commitOid": "a" * 40})
        return httpx2.Response(404, json={"error": f"not part of the fake hub: {request.method} {path}"})


@pytest.fixture()
def hub():
    fake = FakeHub()
    _http.set_client_factory(lambda: httpx2.Client(transport=httpx2.MockTransport(fake)))
    yield fake
    _http.set_client_factory(_http.default_client_factory)


def _trainer(path, **kw):
    args = MAGRPOConfig(**{**dict(output_dir="team", num_train_epochs=1, max_new_tokens=6, num_generations=2,
                                  per_device_train_batch_size=2, report_to=[], agent_learning_rate=5e-2,
                                  disable_tqdm=True), **kw})
    return MAGRPOTrainer(agent_model=path, num_agents=2, reward_func=total_length, peft_config=LORA,
                         train_dataset=Dataset.from_dict({"prompt": PROMPTS[:2]}), args=args)


def test_one_repo_with_agent_subfolders(qwen_dir, hub, tmp_path):
    trainer = _trainer(qwen_dir)
    trainer.train()
    trainer.push_to_hub(hub_model_id="team", token="hf_test")
    assert hub.created == ["team"] and list(hub.commits) == ["me/team"] and len(hub.commits["me/team"]) == 1
    files = hub.commits["me/team"][0]
    assert set(files) == {"README.md"} | {f"agent_{i}/{name}" for i in range(2) for name in AGENT_FILES}
    assert files["agent_1/adapter_model.safetensors"] == open("team/agent_1/adapter_model.safetensors", "rb").read()
    config = json.loads(files["agent_0/adapter_config.json"])
    assert config["base_model_name_or_path"] == qwen_dir and config["r"] == 4
    card = files["agent_1/README.md"].decode()
    for text in ("library_name: peft", f"base_model: {qwen_dir}", "- magrpo", "Agent 1 of a team of 2", "**MAGRPO**",
                 "num_generations: 2", "LoRA: r=4, lora_alpha=8", 'me/team (subfolder="agent_1")'):
        assert text in card, text
    # the pushed repo, rebuilt from the uploaded bytes, loads agent 1 with subfolder= and gives its logits
    repo = tmp_path / "repo"
    for name, data in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_bytes(data)
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(qwen_dir), str(repo), subfolder="agent_1")
    x = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.equal(loaded.eval()(input_ids=x).logits, trainer.agents[1].eval()(input_ids=x).logits)


def test_one_repo_per_agent(qwen_dir, hub):
    trainer = _trainer(qwen_dir)
    trainer.push_to_hub(hub_model_id="team", layout="per_agent", commit_message="agents", token="hf_test")
    assert hub.created == ["team-agent_0", "team-agent_1"]
    for i in range(2):
        (files,) = hub.commits[f"me/team-agent_{i}"]
        assert set(files) == AGENT_FILES  # adapter only: no model.safetensors, no config.json
        assert f"AutoPeftModelForCausalLM.from_pretrained(\"me/team-agent_{i}\")" in files["README.md"].decode()
        assert hub.messages[f"me/team-agent_{i}"] == ["agents"]
    with pytest.raises(ValueError, match="layout must be one of"):
        trainer.push_to_hub(hub_model_id="team", layout="flat")


def test_checkpoints_push_the_agent_layout(qwen_dir, hub):
    trainer = _trainer(qwen_dir, push_to_hub=True, hub_model_id="team", hub_token="hf_test", num_train_epochs=2)
    trainer.train(checkpoint_dir="ck", checkpoint_interval=1)
    pushes = hub.commits["me/team"]
    assert hub.messages["me/team"] == ["Training in progress, epoch 1", "Training in progress, epoch 2"]
    for files in pushes:
        assert set(files) == {f"agent_{i}/{name}" for i in range(2) for name in AGENT_FILES - {"README.md"}}
    assert pushes[1]["agent_0/adapter_model.safetensors"] == open("ck/checkpoint-2/agent_0/adapter_model.safetensors", "rb").read()
    assert pushes[0]["agent_0/adapter_model.safetensors"] != pushes[1]["agent_0/adapter_model.safetensors"]
    assert not any("optimizer" in p for files in pushes for p in files)


def test_full_weights_without_peft_and_cards_on_save(qwen_dir, hub):
    trainer = MAGRPOTrainer(agent_model=qwen_dir, num_agents=2, reward_func=total_length,
                            train_dataset=Dataset.from_dict({"prompt": PROMPTS[:2]}),
                            args=MAGRPOConfig(output_dir="full", report_to=[], max_new_tokens=4))
    trainer.push_to_hub(hub_model_id="full-team", token="hf_test")
    files = hub.commits["me/full-team"][0]
    assert {"agent_0/model.safetensors", "agent_0/config.json", "agent_1/README.md"} <= set(files)
    assert "library_name: transformers" in files["agent_0/README.md"].decode()
    assert not any(p.startswith("checkpoint-") or p == "training_args.json" for p in files)
    os.remove("full/agent_1/README.md")  # written by push_to_hub; the hook must write it again
    trainer.create_model_card()  # Trainer's own hook writes the per-agent cards (no `.config` needed)
    assert os.path.isfile("full/agent_1/README.md")
