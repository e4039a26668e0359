"""config.py: YAML to a frozen typed config; every mistake named by its path."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trainer.config import TrainConfig, ignored_options, load_config, save_config

CONFIGS = Path(__file__).resolve().parents[2] / "trainer" / "configs"


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_shipped_configs_load_and_round_trip(name: str, tmp_path: Path) -> None:
    config = load_config(CONFIGS / name)
    save_config(config, tmp_path / "again.yaml")
    assert load_config(tmp_path / "again.yaml") == config


def test_the_recipe_config_has_the_reports_numbers() -> None:
    config = load_config(CONFIGS / "rstar2_agent_14b.yaml")
    assert (config.rollout.group_size, config.rollout.oversample) == (16, 2)
    assert (config.loss.eps_low, config.loss.eps_high) == (0.2, 0.28)
    assert (config.optim.lr, config.optim.warmup_steps) == (1e-6, 20)
    assert (config.loss.kl_coef, config.loss.entropy_coef) == (0.0, 0.0)
    assert config.loss.aggregation == "token_mean"
    stages = [(s.max_response_tokens, s.hard_only) for s in config.stages]
    assert stages == [(8192, False), (12288, False), (12288, True)]
    assert config.stages[-1].max_turns == 15 and config.rollout.max_turns == 10
    assert [s.steps for s in config.stages] == [300, 85, 125]
    sft = config.sft
    assert (sft.epochs, sft.lr, sft.batch_size) == (3, 5e-6, 128)
    assert config.stages[-1].hard_filter_samples == 8
    assert [(s.reset_optimizer, s.reset_reference) for s in config.stages] == [
        (False, False),
        (False, False),
        (True, False),  # no KL term, so no reference to reset
    ]
    assert (config.rollout.scheduler, config.rollout.engines) == ("balanced", "shared")
    assert (config.eval.every, config.eval.k) == (5, 16)


def test_defaults_are_the_reports() -> None:
    config = TrainConfig()
    assert config.rollout.prompts_per_step == 512 and config.rollout.temperature == 1.0
    assert config.roc.enabled and config.roc.variant == "sample"


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        TrainConfig().optim.lr = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"optim.lrr": 1}, r"optim: unknown key\(s\) \['lrr'\]"),
        ({"optim.lr": "fast"}, "optim.lr: expected float, got 'fast'"),
        ({"rollout.group_size": 1.5}, "rollout.group_size: expected int"),
        ({"rollout.group_size": True}, "rollout.group_size: expected int"),
        ({"loss.aggregation": "sum"}, r"loss.aggregation: 'sum' is not one of"),
        ({"optim.betas": [0.9]}, "optim.betas: expected 2 items"),
        ({"stages": [{"steps": 3}]}, r"stages\[0\]: missing key\(s\) \['name'\]"),
        ({"stages": []}, "stages: at least one stage"),
        ({"rollout.group_size": 1}, "at least 2"),
    ],
)
def test_mistakes_are_errors_that_name_the_field(
    overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        load_config(None, overrides)


def test_overrides_and_yaml_number_forms(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("optim:\n  lr: 1e-6\nloss:\n  dual_clip_c: 3\n")
    config = load_config(
        tmp_path / "c.yaml", {"optim.mini_batches": 4, "tool.sandbox_url": "http://x"}
    )
    assert config.optim.lr == 1e-6  # YAML reads "1e-6" as a string; the float field accepts it
    assert config.loss.dual_clip_c == 3.0 and isinstance(config.loss.dual_clip_c, float)
    assert config.optim.mini_batches == 4 and config.tool.sandbox_url == "http://x"


RELEASE_SCRIPT = {  # examples/run_qwen3-14b_rstar2_agent_weave.sh at ecbfb94, the lines cited
    "train_batch_size": 128,  # L19
    "max_response_length": 8192,  # L21
    "lr": 1e-6,  # L26
    "lr_warmup_steps": 20,  # L27
    "ppo_max_token_len_per_gpu": 20480,  # L31
    "clip_ratio": (0.2, 0.28),  # L36-37
    "n": 32,  # L45
    "min_trace_num": (2, 2),  # L56-57
    "down_sample_to_n": 16,  # L58
    "test_freq": 5,  # L67
    "total_training_steps": 200,  # L68
    "max_assistant_turns": 5,  # rstar2_agent_trainer.yaml L22
}


def test_release_profile_is_the_release_script() -> None:
    config = load_config(CONFIGS / "rstar2_agent_release.yaml")
    r, s = config.rollout, RELEASE_SCRIPT
    assert r.prompts_per_step == s["train_batch_size"]
    assert r.max_response_tokens == s["max_response_length"]
    assert (config.optim.lr, config.optim.warmup_steps) == (s["lr"], s["lr_warmup_steps"])
    assert config.optim.micro_batch_tokens == s["ppo_max_token_len_per_gpu"]
    assert (config.loss.eps_low, config.loss.eps_high) == s["clip_ratio"]
    assert r.group_size * r.oversample == s["n"] and r.group_size == s["down_sample_to_n"]
    assert (config.roc.min_negatives, config.roc.min_positives) == s["min_trace_num"]
    assert config.eval.every == s["test_freq"]
    assert config.total_steps == s["total_training_steps"] and len(config.stages) == 1
    assert r.max_turns == s["max_assistant_turns"]
    assert config.roc.variant == "release" and config.roc.drop_equal_reward
    assert config.tool.max_response_chars == 256  # verl's default
    assert config.loss.dual_clip_c == 3.0  # verl's default
    assert not config.reward.zero_truncated and not config.reward.require_answer_tag
    assert config.prompt.style == "release"


@pytest.mark.parametrize(
    ("overrides", "path"),
    [
        ({"tool.batch_size": 8}, "tool.batch_size"),
        ({"tool.batch_timeout_s": 0.5}, "tool.batch_timeout_s"),
        ({"rollout.chunk_tokens": 256}, "rollout.chunk_tokens"),
        ({"rollout.chunk_tokens": None, "rollout.scheduler": "static"}, "rollout.chunk_tokens"),
        ({"rollout.locality_wait_s": 0.5, "rollout.scheduler": "static"}, "locality_wait_s"),
        ({"rollout.scheduler": "balanced", "rollout.chunk_tokens": 64}, "rollout.chunk_tokens"),
        ({"stages": [{"name": "a", "steps": 1, "reset_reference": True}]}, "reset_reference"),
        ({"roc.variant": "release", "roc.min_penalty": 0.1}, "roc.min_penalty"),
        ({"roc.enabled": False, "roc.variant": "release"}, "roc.variant"),
        ({"roc.enabled": False, "roc.min_positives": 2}, "roc.min_positives"),
        ({"rollout.engines": "shared"}, "rollout.engines"),
        (
            {"rollout.engines": "shared", "rollout.backend": "vllm", "vllm.layout": "separate"},
            "rollout.engines",
        ),
    ],
)
def test_options_that_would_do_nothing_are_refused(overrides: dict[str, object], path: str) -> None:
    """An option set away from its default where nothing reads it is an error naming it."""
    with pytest.raises(ValueError, match=f"do nothing here.*{path}: "):
        load_config(None, overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        {"rollout.scheduler": "balanced", "tool.batch_size": 8, "rollout.locality_wait_s": 0.5},
        {"rollout.scheduler": "balanced", "rollout.backend": "vllm", "rollout.chunk_tokens": 64},
        {"rollout.scheduler": "static", "tool.batch_timeout_s": 0.5},
        {"loss.kl_coef": 0.1, "stages": [{"name": "a", "steps": 1, "reset_reference": True}]},
        {"roc.variant": "release", "roc.min_positives": 2},
        {"roc.min_penalty": 0.1, "roc.min_negatives": 2},
        {"roc.enabled": False, "roc.use_error_ratio": False},  # the logged penalties read it
        {"rollout.engines": "shared", "rollout.backend": "vllm"},
    ],
)
def test_the_same_options_where_they_are_read_are_taken(overrides: dict[str, object]) -> None:
    assert ignored_options(load_config(None, overrides)) == []


def test_every_reason_is_given_at_once() -> None:
    with pytest.raises(ValueError) as caught:
        load_config(None, {"tool.batch_size": 8, "rollout.locality_wait_s": 1.0})
    assert "tool.batch_size: rollout.scheduler rounds" in str(caught.value)
    assert "rollout.locality_wait_s: only balanced" in str(caught.value)


def test_min_counts_beyond_the_group_are_refused() -> None:
    with pytest.raises(ValueError, match="min_positives"):
        load_config(
            None, {"rollout.group_size": 4, "roc": {"min_positives": 3, "min_negatives": 2}}
        )
