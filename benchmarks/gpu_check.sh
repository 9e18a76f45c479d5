#!/usr/bin/env bash
# The whole GPU check of the performance issue in one call (< 9 min on an H200): the fixed length-ratio
# workload (2 agents, K=4, 64 forced tokens, 4 and 16 prompts, 1 epoch) on random-initialised
# SmolLM2-135M-shaped and Qwen2.5-0.5B-shaped models in bf16 (no weights needed), full fine-tune and LoRA,
# printing the same table as on CPU (env-steps/s, gen tok/s, update s/step, peak RSS and GPU memory, floor).
# Target: train time within 1.3x of the floor. Run from the repository root after `make install`.
# First, the placement check (about 1 min): agent 0 on cuda:0 and agent 1 on the CPU (`agent_devices`), MAGRPO and
# IAC, devices kept, finite losses, bitwise resume; one PASS/FAIL line per check (`--cpu` dry-runs it without a GPU).
# The benchmarks still run when it fails; the script then exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
placement=0
timeout 300 "$PY" benchmarks/placement_check.py || placement=$?
for shape in smollm2-shaped 0.5b-shaped; do
  timeout 200 "$PY" benchmarks/compare_comlrl.py --model "$shape" --prompts 4 16 --tokens 64 --bf16
  timeout 120 "$PY" benchmarks/compare_comlrl.py --model "$shape" --prompts 16 --tokens 64 --bf16 --lora
done
# FSDP2 smoke run on the GPU (issue #10): the MAGRPO run of tests/fsdp_worker.py (tiny agents, checkpoint per epoch,
# resume from checkpoint-1) under FSDP2 on CUDA/NCCL. One GPU means one process, so this shows the FSDP2 code path
# (sharding, gather for generate, full-state checkpoints, resume) runs on CUDA, not sharding across devices.
# Prints the largest weight gap between the resumed and the uninterrupted run (0.0 when resume is exact).
FSDP_TMP=$(mktemp -d)
"$PY" -c "from comlrl_hf.testing import save_tiny_model as s; s('$FSDP_TMP/llama', 'llama'); s('$FSDP_TMP/qwen2', 'qwen2')"
ACCELERATE_USE_FSDP=true FSDP_VERSION=2 FSDP_STATE_DICT_TYPE=FULL_STATE_DICT timeout 240 "$PY" -m torch.distributed.run \
  --nproc_per_node 1 tests/fsdp_worker.py "$FSDP_TMP/out" "$FSDP_TMP/llama" "$FSDP_TMP/qwen2"
"$PY" -c "
import torch
s = torch.load('$FSDP_TMP/out/states.pt', weights_only=True)
gap = max((a[k].float() - b[k].float()).abs().max().item() for a, b in zip(s['full']['agents'], s['resumed']['agents']) for k in a)
print('FSDP2 one-GPU smoke run: resume weight gap', gap)
"
if [ "$placement" -ne 0 ]; then
  echo "FAIL  placement check (exit $placement, see its lines above)"
  exit "$placement"
fi
