"""problems.py and toy_task.py: loading, the seeded sampler, the stage-3 filter, the shipped set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.problems import Problem, ProblemSampler, hard_problems, load_problems, write_problems
from trainer.toy_task import SHIPPED, SHIPPED_COUNT, SHIPPED_SEED, toy_problems


def test_jsonl_and_json_round_trip(tmp_path: Path) -> None:
    problems = [Problem("What is 1 + 1?", "2", "a"), Problem("x?", "\\frac{1}{2}", "b")]
    write_problems(tmp_path / "p.jsonl", problems)
    assert load_problems(tmp_path / "p.jsonl") == problems
    (tmp_path / "p.json").write_text(json.dumps([{"problem": "q", "answer": 3, "source": "x"}]))
    assert load_problems(tmp_path / "p.json") == [Problem("q", "3", "0")]


def test_rows_without_problem_or_answer_are_refused(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text(json.dumps({"question": "q", "answer": "1"}) + "\n")
    with pytest.raises(ValueError, match="row 0 lacks 'problem' or 'answer'"):
        load_problems(tmp_path / "bad.jsonl")


def test_shipped_set_is_the_generator_output_with_integer_answers() -> None:
    shipped = load_problems(SHIPPED)
    assert shipped == toy_problems(SHIPPED_COUNT, SHIPPED_SEED)
    assert all(p.answer.lstrip("-").isdigit() for p in shipped)
    assert len({p.id for p in shipped}) == len(shipped)


def test_sampler_covers_each_epoch_and_resumes_exactly() -> None:
    problems = [Problem(str(i), str(i), str(i)) for i in range(10)]
    sampler = ProblemSampler(problems, seed=3)
    first_epoch = sampler.take(10)
    assert sorted(p.id for p in first_epoch) == [str(i) for i in range(10)]
    assert [p.id for p in first_epoch] != [str(i) for i in range(10)]  # shuffled
    sampler.take(4)
    state = sampler.state_dict()
    expected = sampler.take(9)
    resumed = ProblemSampler(problems, seed=3)
    resumed.load_state_dict(state)
    assert resumed.take(9) == expected
    assert [p.id for p in ProblemSampler(problems, seed=3, shuffle=False).take(3)] == [
        "0",
        "1",
        "2",
    ]


def test_hard_filter_drops_only_always_solved_problems() -> None:
    problems = [Problem(str(i), "1", str(i)) for i in range(4)]
    kept = hard_problems(problems, correct=[16, 15, 0, 16], samples=16)
    assert [p.id for p in kept] == ["1", "2"]
    with pytest.raises(ValueError):
        hard_problems(problems, correct=[1], samples=16)


def test_rows_in_the_release_format_are_read(tmp_path: Path) -> None:
    # As data_preprocess/dapo_rstar2_agent_loop.py writes them (parquet there; the same rows).
    row = {
        "data_source": "rstar_open-r1/DAPO-Math-17k-Processed",
        "agent_name": "rstar2_agent",
        "prompt": [{"role": "user", "content": "What is 2 + 2?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "4"},
        "extra_info": {"split": "train", "index": 7},
    }
    path = tmp_path / "release.jsonl"
    path.write_text(json.dumps(row) + "\n")
    assert load_problems(path) == [Problem("What is 2 + 2?", "4", "7")]


def test_held_out_toy_problems_are_outside_the_training_set() -> None:
    from trainer.toy_task import heldout_problems

    held = heldout_problems()
    assert len(held) == 64
    assert not {p.problem for p in held} & {p.problem for p in load_problems(SHIPPED)}
