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
if [ "$placement" -ne 0 ]; then
  echo "FAIL  placement check (exit $placement, see its lines above)"
  exit "$placement"
fi
