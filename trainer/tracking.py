"""Where a run's step metrics go: ``metrics.jsonl`` always, TensorBoard and W&B when they are there.

- ``OUTPUT/metrics.jsonl``: one JSON line per RL step, appended (a resumed run continues it).
  ``python -m trainer.plot`` draws it.
- TensorBoard: ``OUTPUT/tensorboard/`` when the ``tensorboard`` package is installed and
  ``logging.tensorboard`` is on (the default): ``tensorboard --logdir OUTPUT``.
- Weights & Biases: when ``wandb`` is installed and a project is named, by
  ``logging.wandb_project`` or ``WANDB_PROJECT``. Offline works (``WANDB_MODE=offline``: the
  run is written under ``OUTPUT/wandb/``, ``wandb sync`` uploads it later); the run's id is
  kept in ``OUTPUT/wandb_id`` so a resumed run continues the same W&B run.

Only numbers are sent to the two trackers, under ``train/<name>``, at the step's ``step``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

from trainer.config import LoggingConfig, TrainConfig, to_dict

TENSORBOARD_DIR = "tensorboard"
WANDB_ID_FILE = "wandb_id"


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def wandb_project(config: LoggingConfig) -> str | None:
    return config.wandb_project or os.environ.get("WANDB_PROJECT") or None


def scalars(line: dict[str, Any]) -> dict[str, float]:
    """The numeric fields of a metrics line (``stage`` names and the like are left out)."""
    return {
        k: float(v)
        for k, v in line.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and k != "step"
    }


class MetricsLog:
    """Writes each step's metrics to every destination the run has; a context manager.
    ``enabled=False`` (a rank other than 0) writes nothing anywhere."""

    def __init__(self, output: Path, config: TrainConfig, enabled: bool = True) -> None:
        self.jsonl = (output / "metrics.jsonl").open("a") if enabled else None
        self.tensorboard: Any = None
        self.wandb: Any = None
        if not enabled:
            return
        if config.logging.tensorboard and installed("tensorboard"):
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(str(output / TENSORBOARD_DIR))
        project = wandb_project(config.logging)
        if project and installed("wandb"):
            self.wandb = _start_wandb(output, project, config)

    @property
    def destinations(self) -> list[str]:
        named = {"metrics.jsonl": self.jsonl, "tensorboard": self.tensorboard, "wandb": self.wandb}
        return [name for name, sink in named.items() if sink is not None]

    def write(self, line: dict[str, Any]) -> None:
        if self.jsonl is None:
            return
        self.jsonl.write(json.dumps(line) + "\n")
        self.jsonl.flush()
        values = scalars(line)
        step = int(line["step"])
        if self.tensorboard is not None:
            for name, value in values.items():
                self.tensorboard.add_scalar(f"train/{name}", value, step)
            self.tensorboard.flush()
        if self.wandb is not None:
            self.wandb.log({f"train/{k}": v for k, v in values.items()}, step=step, commit=True)

    def close(self) -> None:
        if self.jsonl is not None:
            self.jsonl.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _start_wandb(output: Path, project: str, config: TrainConfig) -> Any:
    """A W&B run in ``output`` (the same run again when the output is resumed)."""
    import wandb

    id_file = output / WANDB_ID_FILE
    run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
    id_file.write_text(run_id)
    return wandb.init(
        project=project,
        name=output.name,
        id=run_id,
        resume="allow",
        dir=str(output),
        config=to_dict(config),
    )
