"""`comlrl-hf`: train cooperating agents from a YAML recipe, in the style of `trl grpo`.

    comlrl-hf magrpo --config recipe.yaml [--field value ...]
    comlrl-hf iac|maac|mareinforce|marloo|maremax|marlhf --config recipe.yaml
    comlrl-hf magrpo --help                      # every field, with its help text

A recipe is a YAML mapping of field names to values: the trainer config's fields (a `TrainingArguments`
subclass, parsed by `HfArgumentParser`) and the script's (`comlrl_hf.recipe.ScriptArguments`: models, data,
reward, checkpoints). Flags on the command line override the recipe. A bad recipe or flag prints one line
naming the problem and exits with code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import sys
import time
from dataclasses import dataclass

from .recipe import (
    MAPPING_FIELDS, RecipeError, ScriptArguments, field_facts, load_prompt_dataset, load_recipe, parse_mapping,
    resolve_callable, resolve_reward,
)

__all__ = ["COMMANDS", "Command", "main"]

EXIT_BAD_INPUT = 2


@dataclass(frozen=True)
class Command:
    module: str
    trainer: str
    config: str
    help: str
    critics: bool = False  # takes critic_model / critics

    def load(self) -> tuple[type, type]:
        """(trainer class, config class); `RecipeError` when this version does not have them."""
        try:
            module = importlib.import_module(self.module)
            return getattr(module, self.trainer), getattr(module, self.config)
        except (ImportError, AttributeError) as error:
            raise RecipeError(
                f"{self.trainer} is not available in this version of comlrl_hf ({self.module}: {error})"
            ) from None


# One line per subcommand.
COMMANDS: dict[str, Command] = {
    "magrpo": Command("comlrl_hf.trainers.reinforce", "MAGRPOTrainer", "MAGRPOConfig", "MAGRPO: group-relative baseline"),
    "mareinforce": Command("comlrl_hf.trainers.reinforce", "MAREINFORCETrainer", "MAREINFORCEConfig", "MAGRPO with raw rewards"),
    "marloo": Command("comlrl_hf.trainers.reinforce", "MARLOOTrainer", "MARLOOConfig", "MAGRPO with a leave-one-out baseline"),
    "maremax": Command("comlrl_hf.trainers.reinforce", "MAReMaxTrainer", "MAReMaxConfig", "MAGRPO with the group max as baseline"),
    "iac": Command("comlrl_hf.trainers.actor_critic", "IACTrainer", "IACConfig", "independent actor-critic", critics=True),
    "maac": Command("comlrl_hf.trainers.actor_critic", "MAACTrainer", "MAACConfig", "multi-agent actor-critic", critics=True),
    "marlhf": Command("comlrl_hf.trainers.preference", "MARLHFTrainer", "MARLHFConfig", "learned joint reward model",
                      critics=True),
}


class _Parser(argparse.ArgumentParser):
    """argparse errors (unknown flag, wrong type) as `RecipeError`: one line, exit code 2."""

    def error(self, message):
        raise RecipeError(message)


def build_parser(name: str, config_cls: type):
    from transformers import HfArgumentParser

    class Parser(_Parser, HfArgumentParser):
        pass

    parser = Parser((ScriptArguments, config_cls), prog=f"comlrl-hf {name}",
                    description=f"Train with {config_cls.__name__}; flags override the --config recipe.")
    parser.add_argument("--config", default=None, help="YAML recipe: a mapping of any of the fields below.")
    return parser


def parse_arguments(name: str, config_cls: type, argv: list[str]) -> tuple[ScriptArguments, object]:
    """Recipe values, overridden by flags -> (ScriptArguments, config)."""
    parser = build_parser(name, config_cls)
    actions = {}
    for action in parser._actions:
        if action.dest != "help" and not any(s.startswith("--no_") for s in action.option_strings):
            actions.setdefault(action.dest, action)
        action.default = argparse.SUPPRESS  # only flags actually given end up in the namespace
    given = vars(parser.parse_args(argv))
    values = {}
    owners = f"ScriptArguments or {config_cls.__name__}"
    facts = field_facts((ScriptArguments, config_cls))
    if given.get("config"):
        values.update(load_recipe(given["config"], actions, facts, owners))
    values.update({k: v for k, v in given.items() if k != "config"})
    for key in MAPPING_FIELDS:
        if key in values:
            values[key] = parse_mapping(key, values[key])
    script_fields = {f.name for f in dataclasses.fields(ScriptArguments)}
    script = ScriptArguments(**{k: v for k, v in values.items() if k in script_fields})
    config_values = {k: v for k, v in values.items() if k not in script_fields}
    config_values.setdefault("output_dir", os.path.join("comlrl-hf-output", name))
    try:
        config = config_cls(**config_values)
    except (ValueError, TypeError) as error:
        raise RecipeError(f"{config_cls.__name__}: {error}") from None
    return script, config


def _datasets(script: ScriptArguments):
    if script.prompts and script.dataset:
        raise RecipeError("give either prompts or dataset, not both")
    if script.prompts:
        from datasets import Dataset

        train = Dataset.from_dict({"prompt": list(script.prompts)})
    elif script.dataset:
        train = load_prompt_dataset(script.dataset, split=script.dataset_split, config_name=script.dataset_config,
                                    prompt_column=script.prompt_column)
    else:
        raise RecipeError("no training data: set dataset (a .json/.jsonl/.csv/.parquet file or a Hub id) or prompts")
    evaluation = None
    if script.eval_dataset:
        evaluation = load_prompt_dataset(script.eval_dataset, split=script.eval_split, config_name=script.dataset_config,
                                         prompt_column=script.prompt_column, what="eval_dataset")
    return train, evaluation


def build_trainer(command: Command, trainer_cls: type, script: ScriptArguments, config):
    """The trainer a recipe describes (models are loaded here)."""
    reward = resolve_reward(script.reward_func, script.reward_kwargs)
    transition = resolve_callable(script.external_transition, "external_transition") if script.external_transition else None
    formatters = None
    if script.formatters:
        formatters = [resolve_callable(spec, "formatters") for spec in script.formatters]
        formatters = formatters[0] if len(formatters) == 1 else formatters
    if not (script.agent_model or script.agents):
        raise RecipeError("no agents: set agent_model (homogeneous) or agents (one per agent)")
    if not command.critics and (script.critic_model or script.critics):
        raise RecipeError(f"{trainer_cls.__name__} takes no critics; remove critic_model / critics")
    train, evaluation = _datasets(script)
    tokenizer = None
    sources = script.tokenizer or (script.agents if command.critics and script.agents else None)
    if sources:
        from transformers import AutoTokenizer

        tokenizer = [AutoTokenizer.from_pretrained(source) for source in sources]
        tokenizer = tokenizer[0] if len(tokenizer) == 1 else tokenizer
    kwargs = dict(agent_model=script.agent_model, agents=script.agents, tokenizer=tokenizer,
                  model_config=script.model_config, reward_func=reward, formatters=formatters,
                  external_transition=transition, train_dataset=train, eval_dataset=evaluation,
                  wandb_config=script.wandb_config, args=config)
    if command.critics:
        kwargs.update(critic_model=script.critic_model, critics=script.critics)
    return trainer_cls(**kwargs)


def _train(trainer, script: ScriptArguments, config) -> str:
    train_kwargs = {}
    if script.checkpoint_dir is not None:
        train_kwargs["checkpoint_dir"] = script.checkpoint_dir
    if script.checkpoint_interval is not None:
        train_kwargs["checkpoint_interval"] = script.checkpoint_interval
    if config.resume_from_checkpoint:  # TrainingArguments' own field: a checkpoint folder, or "latest"
        resume = config.resume_from_checkpoint
        train_kwargs["resume_from_checkpoint"] = True if resume == "latest" else resume
    trainer.train(**train_kwargs)
    save_dir = script.save_dir or os.path.join(config.output_dir, "final")
    trainer.save_model(save_dir)
    return save_dir


def _usage() -> str:
    lines = ["usage: comlrl-hf COMMAND --config recipe.yaml [--field value ...]", "", "commands:"]
    lines += [f"  {name:<12} {command.help}" for name, command in COMMANDS.items()]
    lines += ["", "`comlrl-hf COMMAND --help` lists every field of that command's recipe."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns the exit code (0 done, 2 bad recipe or flags)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else EXIT_BAD_INPUT
    if argv[0] == "--version":
        from . import __version__

        print(f"comlrl-hf {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    prog = f"comlrl-hf {name}"
    try:
        if name not in COMMANDS:
            raise RecipeError(f"unknown command {name!r}; choose one of {', '.join(COMMANDS)}")
        command = COMMANDS[name]
        trainer_cls, config_cls = command.load()
        if "-h" in rest or "--help" in rest:
            build_parser(name, config_cls).print_help()
            return 0
        script, config = parse_arguments(name, config_cls, rest)
        started = time.time()
        print(f"{prog}: loading data and models", file=sys.stderr, flush=True)
        trainer = build_trainer(command, trainer_cls, script, config)
    except RecipeError as error:
        print(f"{prog}: error: {' '.join(str(error).split())}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ValueError as error:  # a mismatch the trainer found at construction (agents, tokenizers, critics, ...)
        print(f"{prog}: error: {' '.join(str(error).split())}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"{prog}: {trainer.num_agents} agents ready in {time.time() - started:.1f} s; training", file=sys.stderr,
          flush=True)
    save_dir = _train(trainer, script, config)
    print(f"{prog}: done in {time.time() - started:.1f} s; agents saved to {save_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
