"""Train N LoRA agents on one shared base, save their adapters, and load one back with AutoPeftModel.

    python examples/lora_agents.py                       # a tiny random model, offline, seconds
    python examples/lora_agents.py --model smollm2       # SmolLM2-135M-Instruct (see smollm2.py), minutes on CPU

The N agents share one frozen base (`peft_backend="shared"`, the default for homogeneous agents with a
`peft_config`), so they cost about one model of memory; each has its own adapter `agent_i`. After training,
`<out>/agents/agent_i/` holds adapter + tokenizer (+ the base model path in adapter_config.json), and
`<out>/merged/agent_i/` the same agent with its adapter merged into full weights.
"""

import argparse
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from datasets import Dataset
from peft import AutoPeftModelForCausalLM, LoraConfig

from comlrl_hf.rewards import length_ratio_reward
from comlrl_hf.testing import save_tiny_model
from comlrl_hf.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

PROMPTS = ["Describe a city in the clouds:", "Invent a new holiday and explain it:",
           "Write a bedtime story for a dragon:", "Design a playground on Mars:"]


def space_share(*completions):
    """Any number of agents: the mean share of spaces in their answers (learnable even by tiny random models)."""
    return [sum(c.count(" ") / max(len(c), 1) for c in joint) / len(joint) for joint in zip(*completions)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "comlrl_hf_lora_agents"))
    args = parser.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    if args.model == "smollm2":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from smollm2 import smollm2_dir

        base, reward, tokens = smollm2_dir(), length_ratio_reward, 32
    else:
        base, reward, tokens = save_tiny_model(os.path.join(args.out, "base"), "qwen2"), space_share, 12
    if args.agents != 2 and reward is length_ratio_reward:
        raise SystemExit("the length-ratio reward scores exactly 2 agents; use --model tiny for other counts")

    trainer = MAGRPOTrainer(
        agent_model=base, num_agents=args.agents, reward_func=reward,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
        args=MAGRPOConfig(output_dir=os.path.join(args.out, "run"), num_train_epochs=args.epochs, num_generations=4,
                          max_new_tokens=tokens, agent_learning_rate=2e-3, temperature=1.0, top_p=1.0, top_k=None,
                          logging_steps=1, report_to=[], disable_tqdm=True, seed=0),
    )
    trainable = sum(p.numel() for a in trainer.agents for p in a.parameters())
    total = sum(p.numel() for p in trainer.model.parameters())
    print(f"backend={trainer.peft_backend}: {trainable:,} trainable adapter parameters of {total:,} in memory")
    trainer.train()
    for log in trainer.state.log_history:
        if "reward" in log:
            print(f"step {log['step']:3d}  env_step {log['env_step']:4d}  reward {log['reward']:.3f}")

    saved = os.path.join(args.out, "agents")
    trainer.save_model(saved)
    trainer.save_merged_model(os.path.join(args.out, "merged"))
    print("saved:", {name: sorted(os.listdir(os.path.join(saved, name))) for name in sorted(os.listdir(saved)) if name.startswith("agent_")})

    reloaded = AutoPeftModelForCausalLM.from_pretrained(os.path.join(saved, "agent_0")).eval()
    ids = trainer.tokenizers[0](PROMPTS[0], return_tensors="pt").input_ids
    with torch.no_grad():
        same = torch.equal(reloaded(input_ids=ids).logits, trainer.agents[0].eval()(input_ids=ids).logits)
    print(f"AutoPeftModelForCausalLM.from_pretrained(agent_0) gives the trained agent's logits: {same}")


if __name__ == "__main__":
    main()
