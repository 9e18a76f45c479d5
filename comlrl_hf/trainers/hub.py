"""Model cards and `push_to_hub` for N agents (the container has no `.config`, so Trainer's card and push
helpers cannot be used as they are).

Two layouts:

- ``layout="subfolders"`` (default): one repo `hub_model_id` holding `README.md` (the team) and `agent_i/`
  (and `critic/` for MAAC). Agent i loads with `from_pretrained(repo, subfolder="agent_i")`.
- ``layout="per_agent"``: one repo per agent, `f"{hub_model_id}-agent_{i}"` (and `-critic` for MAAC).

Every `agent_i/` gets a `README.md` card: algorithm, team, base model, training configuration. Under PEFT the
folders hold adapters only (`adapter_model.safetensors`, `adapter_config.json` with the base model id) plus
the tokenizer. Nothing else from `output_dir` (checkpoints, logs, `training_args.json`) is uploaded.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..models.multi_agent import agent_dir

MODEL_PATTERNS = ["README.md", "agent_*/*", "critic/*"]
HUB_LAYOUTS = ("subfolders", "per_agent")
CARD_FIELDS = (
    "num_agents", "num_turns", "num_generations", "num_train_epochs", "agent_learning_rate", "critic_learning_rate",
    "per_device_train_batch_size", "gradient_accumulation_steps", "max_new_tokens", "temperature", "top_p", "top_k",
    "beta", "loss_type", "advantage_mode", "joint_mode", "discount", "seed",
)


def _base_model_of(folder: str, model) -> str | None:
    config = os.path.join(folder, "adapter_config.json")
    if os.path.isfile(config):
        with open(config, encoding="utf-8") as f:
            return json.load(f).get("base_model_name_or_path")
    return getattr(model, "name_or_path", None) or None


class HubMixin:
    """Mixed into `MultiAgentTrainer`: `create_model_card`, `push_to_hub`, `_push_from_checkpoint`."""

    # ---- cards ----
    def _training_summary(self) -> dict:
        args = json.loads(self.args.to_json_string())
        summary = {k: args[k] for k in CARD_FIELDS if args.get(k) is not None}
        if self.peft_backend is not None:
            summary["peft_backend"] = self.peft_backend
        return summary

    def _agent_card(self, index: int, folder: str, locations: list[str]) -> str:
        from ..models.peft_agents import is_peft_model

        agent = self._container.agents[index]
        peft = is_peft_model(agent)
        base = _base_model_of(folder, agent)
        algorithm = getattr(self, "algorithm_name", type(self).__name__)
        tags = ["comlrl_hf", algorithm.lower(), "multi-agent", "reinforcement-learning"] + (["lora", "peft"] if peft else [])
        lines = ["---", f"library_name: {'peft' if peft else 'transformers'}"]
        if base:
            lines.append(f"base_model: {base}")
        lines += ["tags:"] + [f"- {t}" for t in tags] + ["---", ""]
        n = self.num_agents
        lines += [
            f"# agent_{index}", "",
            f"Agent {index} of a team of {n} cooperating language-model agents trained with **{algorithm}** "
            f"(comlrl_hf, `{type(self).__name__}`).", "",
            "## Team", "", "| agent | base model | location |", "|---|---|---|",
        ]
        for i in range(n):
            other = self._container.agents[i]
            other_base = _base_model_of(os.path.join(os.path.dirname(folder), f"agent_{i}"), other) or "(in memory)"
            lines.append(f"| agent_{i}{' (this one)' if i == index else ''} | {other_base} | {locations[i]} |")
        lines += ["", "## Training configuration", ""]
        lines += [f"- {k}: {v}" for k, v in self._training_summary().items()]
        if peft:
            config_path = os.path.join(folder, "adapter_config.json")
            with open(config_path, encoding="utf-8") as f:
                cfg = json.load(f)
            lines.append(f"- LoRA: r={cfg.get('r')}, lora_alpha={cfg.get('lora_alpha')}, target_modules={cfg.get('target_modules')}")
            load = (f"from peft import AutoPeftModelForCausalLM\n"
                    f"model = AutoPeftModelForCausalLM.from_pretrained(\"{locations[index]}\")  # adapter on {base}")
        else:
            load = f"from transformers import AutoModelForCausalLM\nmodel = AutoModelForCausalLM.from_pretrained(\"{locations[index]}\")"
        lines += ["", "## Loading", "", "```python", load, "```", ""]
        return "\n".join(lines)

    def write_model_cards(self, directory: str | os.PathLike, locations: list[str] | None = None) -> None:
        """`README.md` in each saved `agent_i/` of `directory` (and one for the team at its root).
        `locations[i]` is how agent i is found (repo id, `repo` + subfolder, or folder); defaults to the folder."""
        directory = os.fspath(directory)
        locations = locations or [agent_dir(directory, i) for i in range(self.num_agents)]
        for i in range(self.num_agents):
            folder = agent_dir(directory, i)
            with open(os.path.join(folder, "README.md"), "w", encoding="utf-8") as f:
                f.write(self._agent_card(i, folder, locations))
        algorithm = getattr(self, "algorithm_name", type(self).__name__)
        team = "\n".join(f"- agent_{i}: {loc}" for i, loc in enumerate(locations))
        with open(os.path.join(directory, "README.md"), "w", encoding="utf-8") as f:
            f.write(f"---\ntags:\n- comlrl_hf\n- {algorithm.lower()}\n- multi-agent\n---\n\n# A team of {self.num_agents} "
                    f"{algorithm} agents (comlrl_hf)\n\n{team}\n\nEach agent folder has its own model card.\n")

    def create_model_card(self, *args, **kwargs) -> None:
        """Trainer's card reads `model.config`, which the container lacks: write one card per agent instead."""
        if self.is_world_process_zero() and os.path.isdir(agent_dir(self.args.output_dir, 0)):
            self.write_model_cards(self.args.output_dir)

    # ---- push ----
    def push_to_hub(
        self,
        commit_message: str | None = "End of training",
        blocking: bool = True,
        token: str | None = None,
        revision: str | None = None,
        *,
        layout: str = "subfolders",
        hub_model_id: str | None = None,
        private: bool | None = None,
        **kwargs,
    ):
        """Save the agents to `args.output_dir`, write their cards, and upload them (see the module docstring).
        Returns the commit info (one per repo with `layout="per_agent"`)."""
        from huggingface_hub import create_repo, upload_folder

        if layout not in HUB_LAYOUTS:
            raise ValueError(f"layout must be one of {HUB_LAYOUTS}, got {layout!r}")
        repo = hub_model_id or self.args.hub_model_id or Path(self.args.output_dir).absolute().name
        token = token if token is not None else self.args.hub_token
        private = private if private is not None else self.args.hub_private_repo
        self.save_model(self.args.output_dir, _internal_call=True)
        if not self.is_world_process_zero():
            return None
        out = self.args.output_dir
        central = self._container.critic_layout == "central"
        if layout == "subfolders":
            repo_id = create_repo(repo, token=token, private=private, exist_ok=True).repo_id
            self.write_model_cards(out, [f"{repo_id} (subfolder=\"agent_{i}\")" for i in range(self.num_agents)])
            return upload_folder(repo_id=repo_id, folder_path=out, allow_patterns=MODEL_PATTERNS,
                                 commit_message=commit_message, token=token, revision=revision)
        repo_ids = [create_repo(f"{repo}-agent_{i}", token=token, private=private, exist_ok=True).repo_id
                    for i in range(self.num_agents)]
        self.write_model_cards(out, repo_ids)
        commits = [upload_folder(repo_id=rid, folder_path=agent_dir(out, i), commit_message=commit_message,
                                 token=token, revision=revision) for i, rid in enumerate(repo_ids)]
        if central:
            critic_repo = create_repo(f"{repo}-critic", token=token, private=private, exist_ok=True).repo_id
            commits.append(upload_folder(repo_id=critic_repo, folder_path=os.path.join(out, "critic"),
                                         commit_message=commit_message, token=token, revision=revision))
        return commits

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """With `args.push_to_hub`, each checkpoint's agents (and critic) go to the repo's `agent_i/` folders;
        Trainer's version copies only root-level files, which the container layout does not have."""
        from huggingface_hub import create_repo, upload_folder
        from transformers.trainer_utils import HubStrategy

        if not self.is_world_process_zero() or self.args.hub_strategy == HubStrategy.END:
            return
        repo = self.args.hub_model_id or Path(self.args.output_dir).absolute().name
        token = self.args.hub_token
        repo_id = create_repo(repo, token=token, private=self.args.hub_private_repo, exist_ok=True).repo_id
        message = f"Training in progress, epoch {round(self.state.epoch)}"
        upload_folder(repo_id=repo_id, folder_path=checkpoint_folder, allow_patterns=["agent_*/*", "critic/*"],
                      commit_message=message, token=token, revision=self.args.hub_revision)
        if self.args.hub_strategy in (HubStrategy.CHECKPOINT, HubStrategy.ALL_CHECKPOINTS):
            path = "last-checkpoint" if self.args.hub_strategy == HubStrategy.CHECKPOINT else os.path.basename(checkpoint_folder)
            upload_folder(repo_id=repo_id, folder_path=checkpoint_folder, path_in_repo=path,
                          commit_message=f"{message} ({path})", token=token, revision=self.args.hub_revision)
