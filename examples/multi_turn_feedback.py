"""Two turns with feedback: after each agent answers, an external transition tells it whether its answer was
too short, and the agents answer again. Runs offline on tiny models in seconds (or pass --model).

    python examples/multi_turn_feedback.py [--model DIR_OR_ID] [--joint-mode aligned|cross]

The joint reward asks the second agent to answer 2-3x longer than the first; returns add the second turn's
reward to the first's (discount 1), so a first answer that sets up a good second turn is rewarded.
"""

import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from datasets import Dataset

from comlrl_hf.rewards import length_ratio_reward
from comlrl_hf.testing import save_tiny_model
from comlrl_hf.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer


def feedback(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
    """The next prompt of each agent: the task again, with feedback on its last answer."""
    first, second = agent_completions
    ratio = len(second) / max(len(first), 1)
    hint = "longer" if ratio < 2 else "shorter" if ratio > 3 else "the same length"
    return [f"{prompt} (Your teammate's answer should be {hint}.)", f"{prompt} (Make your answer {hint}.)"]


def formatter(item, external_prompts=None):
    """Turn 1 sees the dataset prompt; later turns see the transition's prompt."""
    return external_prompts or item["prompt"]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None)
    parser.add_argument("--joint-mode", default="aligned", choices=["aligned", "cross"])
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "comlrl_hf_multi_turn"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = args.model or save_tiny_model(os.path.join(args.out, "tiny-qwen2"), "qwen2")
    trainer = MAGRPOTrainer(
        agent_model=model, num_agents=2, reward_func=length_ratio_reward, formatters=formatter,
        external_transition=feedback,
        train_dataset=Dataset.from_dict({"prompt": ["Describe a city in the clouds:", "Design a playground on Mars:"]}),
        args=MAGRPOConfig(output_dir=os.path.join(args.out, "run"), num_turns=2, joint_mode=args.joint_mode,
                          num_generations=2, max_new_tokens=16, num_train_epochs=2, discount=1.0,
                          logging_steps=1, report_to=[], disable_tqdm=True),
    )
    trainer.train(checkpoint_dir=os.path.join(args.out, "checkpoints"), checkpoint_interval=1)
    for log in trainer.state.log_history:
        if "turn_1/reward_mean" in log:
            print(f"env_step {log['env_step']:>4}  turn 1 reward {log['turn_1/reward_mean']:.3f}  "
                  f"turn 2 reward {log['turn_2/reward_mean']:.3f}  turn 1 return {log['turn_1/expected_return']:.3f}")


if __name__ == "__main__":
    main()
