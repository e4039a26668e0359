"""``python -m trainer.sim --seed 0``: the rollout-policy comparison (``compare.py``)."""

from trainer.sim.compare import main

main()
