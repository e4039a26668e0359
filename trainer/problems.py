"""Problems to train on: ``{problem, answer}`` rows from JSONL or parquet, a seeded sampler, and
the stage-3 filter that keeps only problems the policy does not already solve every time.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Problem:
    problem: str
    answer: str
    id: str = ""


def load_problems(path: str | Path) -> list[Problem]:
    """Rows with ``problem`` and ``answer`` (any other columns are ignored) from ``.jsonl``,
    ``.json`` (a list) or ``.parquet`` (which needs pyarrow), or rows as the release's
    ``data_preprocess`` scripts write them (``prompt``: one user message, ``reward_model``:
    ``{"ground_truth": ...}``, ``extra_info.index``). A row without an id gets its index.
    """
    path = Path(path)
    rows = read_rows(path)
    problems = []
    for i, row in enumerate(rows):
        if "problem" not in row and "reward_model" in row and "prompt" in row:
            row = release_row(row)
        if "problem" not in row or "answer" not in row:
            raise ValueError(f"{path}: row {i} lacks 'problem' or 'answer' (has {sorted(row)})")
        problems.append(Problem(str(row["problem"]), str(row["answer"]), str(row.get("id", i))))
    if not problems:
        raise ValueError(f"{path}: no problems")
    return problems


def release_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row of the release's parquet files as ``{problem, answer, id}``: the user message's
    content (the chat template adds the answer-format instruction around it, as ours does)."""
    [message] = [m for m in row["prompt"] if m["role"] == "user"]
    out = {"problem": message["content"], "answer": row["reward_model"]["ground_truth"]}
    index = (row.get("extra_info") or {}).get("index")
    return out if index is None else {**out, "id": index}


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a ``.jsonl`` file, a ``.json`` list, or a ``.parquet`` table."""
    path = Path(path)
    if path.suffix == ".parquet":
        return _parquet_rows(path)
    if path.suffix == ".json":
        rows = json.loads(path.read_text())
        if not isinstance(rows, list):
            raise ValueError(f"{path}: expected a JSON list of rows")
        return rows
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def _parquet_rows(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise RuntimeError(f"reading {path} needs pyarrow: pip install pyarrow") from exc
    return pq.read_table(path).to_pylist()


def write_problems(path: str | Path, problems: Iterable[Problem]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for p in problems:
            f.write(json.dumps({"id": p.id, "problem": p.problem, "answer": p.answer}) + "\n")


class ProblemSampler:
    """Endless epochs over the problems, each epoch a fresh seeded permutation.

    Its whole state is (epoch, position), so a checkpoint stores where the data stands in two
    integers and a resumed run sees the same problems the uninterrupted run would have.
    """

    def __init__(self, problems: Sequence[Problem], seed: int, shuffle: bool = True) -> None:
        self.problems = list(problems)
        self.seed, self.shuffle = seed, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.problems)))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def take(self, count: int) -> list[Problem]:
        out = []
        for _ in range(count):
            if self.position == len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            out.append(self.problems[self._order[self.position]])
            self.position += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._permutation(self.epoch)


def hard_problems(
    problems: Sequence[Problem], correct: Sequence[int], samples: int
) -> list[Problem]:
    """Stage 3's filter: drop every problem all ``samples`` of whose rollouts were correct.

    ``correct[i]`` is how many of problem ``i``'s rollouts (by the latest policy) were right.
    """
    if len(correct) != len(problems):
        raise ValueError(f"{len(correct)} counts for {len(problems)} problems")
    return [p for p, c in zip(problems, correct, strict=True) if c < samples]
