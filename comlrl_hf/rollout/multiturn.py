r"""Multi-turn rollout trees: joint actions, transitions, discounted returns and per-agent credit.

A node is one per-agent prompt tuple at turn $t$. Each agent samples K completions there; the joint
actions of the node are

- ``aligned``: $J = K$ tuples $(y_1^k, \dots, y_N^k)$;
- ``cross``:   $J = K^N$ tuples, every combination of one completion per agent.

Each joint action $j$ gets the reward $r_j$. Unless the node is a leaf (last turn, or early termination),
``external_transition`` maps joint action $j$ to the next per-agent prompts, the root of child node $j$.
Returns are discounted: $G_j = r_j + \gamma \cdot \operatorname{mean}_{j'} G^{child(j)}_{j'}$, and $G_j = r_j$
at a leaf. Agent $i$'s completion $k$ is credited with the mean return of the joint actions that contain it
(aligned: exactly $G_k$). A tree holds $\sum_{t<T} J^t$ nodes per prompt: $K^t$ nodes at turn $t$ when
aligned, $K^{N t}$ when crossed.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch

JOINT_MODES = ("aligned", "cross")


def joint_actions(num_generations: int, num_agents: int, mode: str) -> list[tuple[int, ...]]:
    """Index tuples (one completion index per agent) of a node's joint actions."""
    if mode == "aligned":
        return [(k,) * num_agents for k in range(num_generations)]
    if mode == "cross":
        return list(itertools.product(range(num_generations), repeat=num_agents))
    raise ValueError(f"joint_mode must be one of {JOINT_MODES}, got {mode!r}")


def tree_nodes_per_prompt(num_generations: int, num_agents: int, num_turns: int, mode: str) -> int:
    """Nodes of a full tree (no early termination) rooted at one prompt."""
    width = num_generations if mode == "aligned" else num_generations**num_agents
    return sum(width**t for t in range(num_turns))


def credit_to_agents(returns: torch.Tensor, actions: Sequence[tuple[int, ...]], num_generations: int) -> torch.Tensor:
    """Per-agent per-completion returns [N, K] from one node's joint-action returns [J]: the mean over the
    joint actions containing each completion."""
    index = torch.tensor(actions, device=returns.device)  # [J, N]
    num_agents = index.shape[1]
    totals = torch.zeros(num_agents, num_generations, dtype=returns.dtype, device=returns.device)
    counts = torch.zeros_like(totals)
    for i in range(num_agents):
        totals[i].index_add_(0, index[:, i], returns)
        counts[i].index_add_(0, index[:, i], torch.ones_like(returns))
    return totals / counts


def discounted_returns(
    rewards: Sequence[torch.Tensor], children: Sequence[Sequence[list[int] | None]], discount: float
) -> list[torch.Tensor]:
    """Returns per turn, from the leaves up.

    `rewards[t]` is [nodes_t, J] (joint-action rewards of turn t's nodes); `children[t][n]` lists, for node n of
    turn t, the child node index (in turn t+1) of each joint action, or None when n is a leaf.
    """
    returns = [r.clone() for r in rewards]
    for t in range(len(rewards) - 2, -1, -1):
        for n, kids in enumerate(children[t]):
            if kids is not None:
                future = torch.stack([returns[t + 1][c].mean() for c in kids])
                returns[t][n] = rewards[t][n] + discount * future
    return returns


class TransitionCaller:
    """Calls `external_transition(prompt=, agent_completions=, num_agents=, prompt_history_per_agent=,
    response_history_per_agent=)` and checks that it returns one string per agent."""

    def __init__(self, transition: Callable, num_agents: int):
        if not callable(transition):
            raise ValueError(f"external_transition must be callable, got {type(transition).__name__}")
        self.transition, self.num_agents = transition, num_agents

    def __call__(self, *, prompt: Any, agent_completions: list[str], prompt_history: list[list], response_history: list[list], turn: int) -> list[str]:
        result = self.transition(
            prompt=prompt,
            agent_completions=list(agent_completions),
            num_agents=self.num_agents,
            prompt_history_per_agent=[list(h) for h in prompt_history],
            response_history_per_agent=[list(h) for h in response_history],
        )
        if isinstance(result, (str, bytes)) or not isinstance(result, Sequence) or len(result) != self.num_agents:
            raise ValueError(
                f"external_transition must return {self.num_agents} prompts (one per agent) after turn {turn}, "
                f"got {type(result).__name__}: {result!r:.120}"
            )
        for i, p in enumerate(result):
            if not isinstance(p, str):
                raise ValueError(
                    f"external_transition returned a {type(p).__name__} for agent {i} after turn {turn}; prompts must be strings"
                )
        return list(result)


def format_turn_prompt(formatter: Callable, item: Any, external_prompt: str | None, passthrough: bool) -> Any:
    """The prompt of one agent at one turn: `formatter(item)` at the root; later, the transition's prompt
    verbatim (`passthrough`), given to a formatter that declares `external_prompts`, or in place of
    `item["prompt"]` before formatting."""
    if external_prompt is None:
        return formatter(item)
    if passthrough:
        return external_prompt
    if _accepts(formatter, "external_prompts"):
        return formatter(item, external_prompts=external_prompt)
    replaced = dict(item) if isinstance(item, dict) else {"prompt": external_prompt}
    replaced["prompt"] = external_prompt
    return formatter(replaced)


def _accepts(func: Callable, name: str) -> bool:
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


class _Node:
    __slots__ = ("item", "external", "prompt_history", "response_history")

    def __init__(self, item: int, external: list[str] | None, prompt_history: list[list], response_history: list[list]):
        self.item, self.external = item, external
        self.prompt_history, self.response_history = prompt_history, response_history


class TurnRollout:
    """One turn of a batch of trees: `agents[i]` holds agent i's rows (node-major, K per node),
    `rewards` is [nodes, J], `children[n]` the child node of each joint action (None at a leaf)."""

    def __init__(self, agents, rewards, children, items, prompts):
        self.agents, self.rewards, self.children, self.items = agents, rewards, children, items
        self.prompts = prompts  # [agent][node]: the formatted prompt of each node
        self.advantages: list[torch.Tensor] = []  # per agent, [nodes * K], set by the trainer


def roll_out_tree(
    batch: Sequence[Any],
    *,
    generate: Callable[[int, list[Any], int], Any],
    generate_all: Callable[[list[list[Any]], int], list[Any]] | None = None,
    formatters: Sequence[Callable],
    score: Callable[[list[list[str]], list[Any]], list[float]],
    transition: TransitionCaller | None,
    num_generations: int,
    num_turns: int,
    joint_mode: str,
    early_termination_threshold: float | None,
    external_prompt_passthrough: bool,
) -> list[TurnRollout]:
    """Grow the rollout trees of a batch turn by turn: at each turn one batched generation per agent over all
    nodes, one reward call over all joint actions, then the transitions that root the next turn's nodes.

    `generate(agent_index, prompts, K)` returns an object with `.completions` (K per prompt, prompt-major);
    `score(completions_per_agent, items)` returns one reward per joint action. `generate_all(prompts_per_agent, K)`,
    when given, replaces the per-agent calls with one call for all agents (shared-base LoRA adapters).
    """
    num_agents = len(formatters)
    actions = joint_actions(num_generations, num_agents, joint_mode)
    nodes = [_Node(b, None, [[] for _ in range(num_agents)], [[] for _ in range(num_agents)]) for b in range(len(batch))]
    turns: list[TurnRollout] = []
    for turn in range(num_turns):
        prompts = [
            [format_turn_prompt(fmt, batch[node.item], node.external[i] if node.external else None, external_prompt_passthrough)
             for node in nodes]
            for i, fmt in enumerate(formatters)
        ]
        if generate_all is not None:
            rollouts = generate_all(prompts, num_generations)
        else:
            rollouts = [generate(i, prompts[i], num_generations) for i in range(num_agents)]
        K = num_generations
        completions = [
            [r.completions[n * K + a[i]] for n in range(len(nodes)) for a in actions] for i, r in enumerate(rollouts)
        ]
        items = [batch[node.item] for node in nodes for _ in actions]
        rewards = torch.tensor(score(completions, items), dtype=torch.float32).view(len(nodes), len(actions))
        children: list[list[int] | None] = [None] * len(nodes)
        next_nodes: list[_Node] = []
        if turn < num_turns - 1:
            for n, node in enumerate(nodes):
                if early_termination_threshold is not None and rewards[n].mean().item() > early_termination_threshold:
                    continue
                children[n] = []
                for a in actions:
                    joint = [rollouts[i].completions[n * K + a[i]] for i in range(num_agents)]
                    prompt_history = [node.prompt_history[i] + [prompts[i][n]] for i in range(num_agents)]
                    response_history = [node.response_history[i] + [joint[i]] for i in range(num_agents)]
                    item = batch[node.item]
                    next_prompts = transition(
                        prompt=item.get("prompt") if isinstance(item, dict) else item, agent_completions=joint,
                        prompt_history=prompt_history, response_history=response_history, turn=turn + 1,
                    )
                    children[n].append(len(next_nodes))
                    next_nodes.append(_Node(node.item, next_prompts, prompt_history, response_history))
        turns.append(TurnRollout(rollouts, rewards, children, items, prompts))
        nodes = next_nodes
        if not nodes:
            break
    return turns
