"""`MultiAgentConfig`: `transformers.TrainingArguments` plus the multi-agent fields."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from transformers import TrainingArguments

from ..rollout.sampling import sampling_kwargs
from ..utils.losses import LOSS_TYPES
from .placement import check_placement_world_size, normalize_devices, resolve_devices

DEFAULT_AGENT_LEARNING_RATE = 5e-6


@dataclass
class MultiAgentConfig(TrainingArguments):
    r"""
    Configuration shared by every comlrl_hf trainer. It *is* a `transformers.TrainingArguments`, so every Trainer
    option (seed, optimizer, precision, logging, `report_to`, `push_to_hub`, ...) works as usual; the fields
    below add what N cooperating agents need. It works with no `output_dir` and with `HfArgumentParser`.

    Parameters whose defaults differ from `TrainingArguments`:
        num_train_epochs (`float`, defaults to `20`): as in the original comlrl.
        learning_rate (`float` or `None`): alias of `agent_learning_rate`; set at most one of the two.
        lr_scheduler_type (`str`, defaults to `"constant"`): a schedule that does not depend on the run's length,
            so a resumed run with more epochs continues exactly. A decaying schedule is recomputed for the new
            total on resume.
        per_device_train_batch_size (`int`, defaults to `2`): **prompts** per micro-batch. Each prompt yields
            `num_generations` joint completions, so a step scores `2 * num_generations` joint actions. (TRL's
            GRPOConfig counts completions here; we count prompts because each agent generates its own.)
        per_device_eval_batch_size (`int`, defaults to `8`): prompts per evaluation batch.
        logging_steps (`float`, defaults to `10`): optimizer steps between logs (metrics carry `env_step`).
        save_strategy (`str`, defaults to `"no"`): checkpoints are off unless asked for.
        remove_unused_columns (`bool`, defaults to `False`): reward functions see every dataset column.

    > Agents

        num_agents (`int` or `None`): number of agents; `None` takes it from the trainer (its `num_agents`
            argument or the length of `agents`), else 2. When set, it must agree with the trainer.
        agent_learning_rate (`float`, defaults to `5e-6`): AdamW learning rate of every agent's parameter group.
        critic_learning_rate (`float` or `None`): learning rate of critic parameter groups (`None`: the agent rate).
        agent_devices (`list[str]` or `None`): the device of each agent in this process (`["cuda:0", "cuda:1"]`), or
            one device for all (`"cuda:1"` or `["cuda:1"]`); `None`: every agent on the trainer's device. Set, the
            Trainer never moves the agents as one; rewards and advantages are computed on the trainer's device.
            One process only; not with shared-base LoRA on several devices (docs/scaling.md).

    > Generation

        num_generations (`int`, defaults to `4`): completions per agent per prompt (the group size K).
        max_new_tokens (`int`, defaults to `256`), min_new_tokens (`int` or `None`)
        temperature (`float`, defaults to `0.6`), top_p (`float`, defaults to `0.6`),
        top_k (`int` or `None`, defaults to `50`; `None` or 0 disables top-k)
        num_turns (`int`, defaults to `1`): turns per episode (> 1 needs an `external_transition`).
        joint_mode (`str`, defaults to `"aligned"`): `"aligned"` (K joint actions per node) or `"cross"` (K^N).
        discount (`float`, defaults to `1.0`): weight of later turns in the returns.
        early_termination_threshold (`float` or `None`): a node whose mean reward exceeds it gets no next turn.
        external_prompt_passthrough (`bool`): use the transition's prompts verbatim, bypassing formatters.
        max_tree_nodes (`int`, defaults to `256`): cap on nodes per prompt (K^t per turn aligned, K^(N t) cross).
        eval_do_sample (`bool`, defaults to `False`): evaluation decodes greedily unless set.

    > Loss (see `comlrl_hf.utils.losses`)

        loss_type (`str`, defaults to `"grpo"`): `"grpo"` (per-sequence token mean), `"dapo"` (token mean over
            the micro-batch) or `"dr_grpo"` (token sum / (sequences x max_new_tokens)).
        num_ppo_epochs (`int`, defaults to `1`): optimizer passes per rollout batch; above 1 the ratio to the
            sampling policy is clipped to [1 - epsilon, 1 + epsilon_high]. (TRL's GRPOConfig calls this
            `num_iterations`; here that name belongs to MARLHFIter's outer iterations, spec §5.)
        loss_chunk_size (`int` or `None`): rows per forward+backward of the policy loss; generation still batches
            the whole step, while activation memory is bounded by the chunk (same gradient up to rounding).
        epsilon (`float`, defaults to `0.2`), epsilon_high (`float` or `None`: same as epsilon)
        beta (`float`, defaults to `0.0`): weight of the k3 KL to a frozen copy of each initial agent (0: no
            reference model is kept).

    > Logging

        log_completions (`bool`, defaults to `False`): log a table of prompts and each agent's completion at
            every log (printed, and to W&B when it reports there).
        num_completions_to_print (`int`, defaults to `4`): rows of that table.

    > Distributed training

        seed_generation_per_prompt (`bool`, defaults to `False`): generate each prompt's K samples in a `generate`
            call of their own, under an RNG seeded from (`seed`, global step, the prompt's dataset index, agent).
            Rollouts then depend neither on which other prompts share the batch nor on how many processes
            share the global batch, so a 2-process run reproduces the 1-process run. Single-turn only; slower
            (one call per prompt instead of one per batch).
    """

    # ---- TrainingArguments defaults we change ----
    num_train_epochs: float = field(default=20.0, metadata={"help": "Total number of training epochs."})
    learning_rate: float | None = field(
        default=None, metadata={"help": "Alias of `agent_learning_rate` (set at most one of the two)."}
    )
    lr_scheduler_type: str = field(
        default="constant",
        metadata={"help": "Learning-rate schedule; 'constant' keeps resumed runs with more epochs exact."},
    )
    per_device_train_batch_size: int = field(
        default=2, metadata={"help": "Prompts per training micro-batch (each yields num_generations joint actions)."}
    )
    per_device_eval_batch_size: int = field(default=8, metadata={"help": "Prompts per evaluation batch."})
    logging_steps: float = field(default=10, metadata={"help": "Optimizer steps between two logs."})
    save_strategy: str = field(
        default="no", metadata={"help": "Trainer checkpoint strategy; see also train(checkpoint_dir=...)."}
    )
    remove_unused_columns: bool = field(
        default=False, metadata={"help": "Keep every dataset column so reward functions can read them."}
    )

    disable_dropout: bool = field(
        default=True, metadata={"help": "Turn dropout off in the agents (and critics), as TRL does, so on-policy ratios are 1."}
    )
    shuffle_dataset: bool = field(
        default=True, metadata={"help": "Shuffle the prompts every epoch (seeded by seed + epoch)."}
    )

    # ---- agents ----
    num_agents: int | None = field(
        default=None,
        metadata={"help": "Number of agents; None takes it from the trainer's agents. Must agree with the trainer."},
    )
    agent_learning_rate: float | None = field(
        default=None, metadata={"help": f"Learning rate of each agent's parameter group (default {DEFAULT_AGENT_LEARNING_RATE})."}
    )
    critic_learning_rate: float | None = field(
        default=None, metadata={"help": "Learning rate of critic parameter groups; None uses agent_learning_rate."}
    )
    agent_devices: list[str] | None = field(
        default=None,
        metadata={"help": "Device of each agent in this process (e.g. cuda:0 cuda:1), or one device for all; None: "
                          "every agent on the trainer's device. One process only."},
    )

    # ---- generation ----
    num_generations: int = field(default=4, metadata={"help": "Completions per agent per prompt (group size K)."})
    max_new_tokens: int = field(default=256, metadata={"help": "Maximum new tokens per completion."})
    min_new_tokens: int | None = field(
        default=None, metadata={"help": "Minimum new tokens per completion (forces length, e.g. in benchmarks)."}
    )
    temperature: float = field(default=0.6, metadata={"help": "Sampling temperature (> 0)."})
    top_p: float = field(default=0.6, metadata={"help": "Nucleus sampling probability mass in (0, 1]."})
    top_k: int | None = field(default=50, metadata={"help": "Top-k sampling; None or 0 disables it. With top-k on, the draw is made among the top-k logits only (same kept tokens and probabilities as transformers' warpers)."})
    num_turns: int = field(default=1, metadata={"help": "Turns per episode (> 1 needs an external_transition)."})
    joint_mode: str = field(
        default="aligned",
        metadata={"help": "Joint actions per node: 'aligned' (sample k of every agent) or 'cross' (every combination)."},
    )
    discount: float = field(default=1.0, metadata={"help": "Discount of later turns' returns, in [0, 1]."})
    early_termination_threshold: float | None = field(
        default=None, metadata={"help": "Stop expanding a node whose mean reward exceeds this (None: never)."}
    )
    external_prompt_passthrough: bool = field(
        default=False, metadata={"help": "Use the transition's prompts verbatim instead of formatting them."}
    )
    max_tree_nodes: int = field(
        default=256, metadata={"help": "Refuse settings whose rollout tree has more nodes per prompt than this."}
    )
    eval_do_sample: bool = field(
        default=False, metadata={"help": "Sample during evaluation (default: greedy decoding)."}
    )

    loss_type: str = field(
        default="grpo", metadata={"help": f"Loss normalisation, one of {LOSS_TYPES}.", "choices": list(LOSS_TYPES)}
    )
    num_ppo_epochs: int = field(default=1, metadata={"help": "Optimizer passes per rollout batch (mu)."})
    loss_chunk_size: int | None = field(
        default=None,
        metadata={"help": "Rows per forward+backward of the policy loss (None: all rows of a turn at once); bounds "
                          "the policy loss's activation memory when a step generates many rows, with the same gradient."},
    )
    epsilon: float = field(default=0.2, metadata={"help": "Lower clipping range of the policy ratio."})
    epsilon_high: float | None = field(default=None, metadata={"help": "Upper clipping range (None: epsilon)."})
    beta: float = field(default=0.0, metadata={"help": "KL coefficient to the initial policy (0 keeps no reference)."})
    log_completions: bool = field(default=False, metadata={"help": "Log a table of sampled completions."})
    seed_generation_per_prompt: bool = field(
        default=False,
        metadata={"help": "Sample each prompt's group in its own generate call, seeded from (seed, step, dataset index, "
                          "agent): rollouts then do not depend on the batch or the number of processes (single-turn; slower)."},
    )
    num_completions_to_print: int = field(default=4, metadata={"help": "Rows of the completions table."})

    def __post_init__(self):
        # One source of truth for the learning rate: agent_learning_rate, with learning_rate as its alias.
        if self.learning_rate is not None and self.agent_learning_rate is not None:
            if self.learning_rate != self.agent_learning_rate:
                raise ValueError(
                    f"learning_rate={self.learning_rate} and agent_learning_rate={self.agent_learning_rate} disagree; "
                    "set only agent_learning_rate."
                )
        rate = self.agent_learning_rate if self.agent_learning_rate is not None else self.learning_rate
        self.agent_learning_rate = self.learning_rate = DEFAULT_AGENT_LEARNING_RATE if rate is None else rate
        self._validate_multi_agent_fields()
        super().__post_init__()
        # after the Trainer's device setup: the process count is known only then
        check_placement_world_size(self.world_size, self.agent_devices, getattr(self, "critic_devices", None))

    @property
    def place_model_on_device(self) -> bool | None:
        """False with `agent_devices`/`critic_devices`: each model is already on its device and the Trainer must
        not move the container to `args.device` as one (None: the Trainer's own rule)."""
        if self.agent_devices is not None or getattr(self, "critic_devices", None) is not None:
            return False
        return None

    def _validate_multi_agent_fields(self) -> None:
        def positive_int(name: str, value, minimum: int = 1):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")

        if self.num_agents is not None:
            positive_int("num_agents", self.num_agents)
        positive_int("num_generations", self.num_generations)
        positive_int("max_new_tokens", self.max_new_tokens)
        positive_int("num_turns", self.num_turns)
        if self.min_new_tokens is not None:
            positive_int("min_new_tokens", self.min_new_tokens, 0)
            if self.min_new_tokens > self.max_new_tokens:
                raise ValueError(
                    f"min_new_tokens={self.min_new_tokens} exceeds max_new_tokens={self.max_new_tokens}"
                )
        if not (isinstance(self.temperature, (int, float)) and self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number > 0, got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k is not None:
            positive_int("top_k", self.top_k, 0)
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}")
        if self.loss_chunk_size is not None:
            positive_int("loss_chunk_size", self.loss_chunk_size)
        if not isinstance(self.num_ppo_epochs, int) or self.num_ppo_epochs < 1:
            raise ValueError(f"num_ppo_epochs must be an integer >= 1, got {self.num_ppo_epochs!r}")
        if not self.epsilon > 0 or (self.epsilon_high is not None and not self.epsilon_high > 0):
            raise ValueError(f"epsilon and epsilon_high must be > 0, got {self.epsilon!r} and {self.epsilon_high!r}")
        if not self.beta >= 0:
            raise ValueError(f"beta must be >= 0, got {self.beta!r}")
        if self.joint_mode not in ("aligned", "cross"):
            raise ValueError(f"joint_mode must be 'aligned' or 'cross', got {self.joint_mode!r}")
        if not (isinstance(self.discount, (int, float)) and 0 <= self.discount <= 1):
            raise ValueError(f"discount must be in [0, 1], got {self.discount!r}")
        positive_int("max_tree_nodes", self.max_tree_nodes)
        self.agent_devices = normalize_devices("agent_devices", self.agent_devices)
        if self.agent_devices is not None and self.num_agents is not None:  # else the trainer checks the length
            resolve_devices("agent_devices", self.agent_devices, self.num_agents, "agents")
        if self.num_agents is not None:  # else checked by the trainer once it knows the agent count
            self.check_tree_size(self.num_agents)
        for name in ("agent_learning_rate", "critic_learning_rate"):
            value = getattr(self, name)
            if value is not None and not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.per_device_train_batch_size < 1:
            raise ValueError(f"per_device_train_batch_size must be >= 1, got {self.per_device_train_batch_size}")
        # TrainingArguments accepts these; a zero or negative value would fail later with an unrelated error
        # (a zero division, range() step 0) or silently train nothing / never stop an episode.
        positive_int("per_device_eval_batch_size", self.per_device_eval_batch_size)
        positive_int("gradient_accumulation_steps", self.gradient_accumulation_steps)
        positive_int("num_completions_to_print", self.num_completions_to_print, 0)
        epochs = self.num_train_epochs
        if isinstance(epochs, bool) or not isinstance(epochs, (int, float)) or not math.isfinite(epochs) or epochs < 0:
            raise ValueError(f"num_train_epochs must be a finite number >= 0, got {epochs!r}")
        if epochs == 0 and (self.max_steps is None or self.max_steps <= 0):
            raise ValueError("num_train_epochs=0 with no max_steps trains nothing; set num_train_epochs > 0 or max_steps")
        if self.seed_generation_per_prompt and self.num_turns != 1:
            raise ValueError(f"seed_generation_per_prompt supports num_turns=1 only, got num_turns={self.num_turns}")
        threshold = self.early_termination_threshold
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                      or math.isnan(threshold)):
            raise ValueError(f"early_termination_threshold must be a number or None, got {threshold!r}")

    def check_tree_size(self, num_agents: int) -> None:
        from ..rollout.multiturn import tree_nodes_per_prompt

        nodes = tree_nodes_per_prompt(self.num_generations, num_agents, self.num_turns, self.joint_mode)
        if nodes > self.max_tree_nodes:
            raise ValueError(
                f"a {self.joint_mode} rollout tree with num_generations={self.num_generations}, "
                f"num_agents={num_agents} and num_turns={self.num_turns} has {nodes} nodes per prompt, "
                f"more than max_tree_nodes={self.max_tree_nodes}"
            )

    def generation_kwargs(self, *, do_sample: bool = True) -> dict:
        """Keyword arguments for `model.generate` built from this config."""
        kwargs = {"max_new_tokens": self.max_new_tokens, "do_sample": do_sample}
        if self.min_new_tokens:
            kwargs["min_new_tokens"] = self.min_new_tokens
        if do_sample:
            kwargs.update(sampling_kwargs(self.temperature, self.top_k, self.top_p))
        return kwargs
