"""A simulation of one RL step's rollouts on simulated time, driven by the real scheduler.

``python -m trainer.sim --seed 0`` compares rollout policies (``compare.py``). Engines are
``engine.SimEngine`` (continuous batching over a paged KV cache), rollouts and tool latencies
come from ``workload.py`` (latencies measured on the real service by ``record.py``), and
``clock.py`` runs asyncio on simulated time so that ``trainer.scheduler`` (and
``trainer.placement``, ``trainer.tool_dispatch``) run unchanged.
"""
