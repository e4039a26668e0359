#!/usr/bin/env bash
# The GPU smoke test of the vLLM backend and FSDP (trainer/scripts/gpu_smoke.py): one GPU, no
# internet, under 8 minutes on one H200 including the install.
#
# Beforehand, on a machine with internet and the GPU machine's OS, CPU architecture and Python:
#   pip download -d wheels setuptools wheel '.[trainer,gpu]'
# (about 5 GB: vLLM, its CUDA torch and the NVIDIA libraries; docs/gpu.md). Then, there:
#   WHEELS=/path/to/wheels bash trainer/scripts/gpu_smoke.sh [--prompts 32 --sleep-level 2]
#
# WHEELS unset: the environment in $VENV (default .venv-gpu) must already have everything.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VENV:-.venv-gpu}
start=$(date +%s)
if [ -n "${WHEELS:-}" ] && [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --no-index --find-links "$WHEELS" setuptools wheel
    # No build isolation: it would fetch setuptools from the network.
    "$VENV/bin/pip" install -q --no-index --find-links "$WHEELS" --no-build-isolation \
        -e '.[trainer,gpu]'
fi
echo "install: $(( $(date +%s) - start )) s"
# Weight buckets are shared with the engine by CUDA IPC, which expandable segments break.
unset PYTORCH_CUDA_ALLOC_CONF
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
timeout 420 "$VENV/bin/python" -m trainer.scripts.gpu_smoke "$@"
echo "total: $(( $(date +%s) - start )) s"
