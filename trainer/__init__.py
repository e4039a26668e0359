"""GRPO-RoC, the rStar2-Agent recipe: multi-turn tool rollouts against the sandbox service.

Modules, one concept each: ``tools`` (the tool protocol), ``chat`` (turn markers), ``rollout``
(the agent loop on token ids), ``reward``, ``roc`` (Resample-on-Correct), ``grpo`` (advantages
and the clipped loss), ``update`` (one policy update), ``train`` / ``sft`` / ``evaluate`` (the
commands). ``docs/trainer.md`` walks through them.
"""
