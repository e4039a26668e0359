"""Scripts run by hand: the GPU smoke test (gpu_smoke.sh)."""
