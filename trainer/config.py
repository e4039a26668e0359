"""The training configuration: YAML in, one frozen, typed, validated object out.

Every knob of a run is a field here with its default; a YAML file sets any subset, and an
unknown key or a value of the wrong type is an error naming its path (``optim.lr``), never a
silent default. The resolved config is written next to the run's metrics.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from trainer.grpo import Aggregation, ClipSettings
from trainer.sft_data import SftFormat
from trainer.tools import PromptStyle, TruncateSide


@dataclass(frozen=True)
class TinyModelConfig:
    """The shape of a tiny Qwen2; the defaults run a training step in well under a second on CPU."""

    vocab_size: int = 1024
    hidden_size: int = 64
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_positions: int = 4096


@dataclass(frozen=True)
class ModelConfig:
    path: str = "tiny"  # a local directory or hub id; "tiny" builds a tiny Qwen2 for the toy task
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    device: str = "auto"  # "auto": cuda if available, else cpu
    precision: Literal["auto", "float32", "bfloat16"] = (
        "auto"  # auto: bf16 autocast on GPUs with it
    )
    gradient_checkpointing: bool = False
    fsdp: bool = False  # shard with FSDP2 (trainer/fsdp.py); under torchrun, across its ranks
    cpu_threads: int = 0  # torch's intra-op threads on CPU; 0: torch's default


@dataclass(frozen=True)
class DataConfig:
    # JSONL/parquet of {problem, answer} (or the release's rows); "toy": the shipped toy set
    train: str = "toy"
    eval: str | None = None  # held-out problems for the `eval` section; "toy-heldout" for toy
    shuffle: bool = True


@dataclass(frozen=True)
class RolloutConfig:
    group_size: int = 16  # G: rollouts per prompt that enter the update
    oversample: int = 2  # RoC samples oversample * G and keeps G
    prompts_per_step: int = 512
    max_turns: int = 10  # assistant turns; the stage may override
    max_response_tokens: int = 8192  # model + tool tokens after the prompt; the stage may override
    temperature: float = 1.0
    top_p: float = 1.0
    max_batch: int = 1024  # sequences per generation call of the backend
    # rounds: every rollout a turn, then all tool calls in one batch (reproducible on CPU);
    # static / balanced: each rollout at its own pace, tool calls sent as its turn ends, turns
    # on a fixed engine (static) or placed by free KV cache with prefix affinity (balanced).
    # What a scheduler does not read is refused when set (ignored_options).
    scheduler: Literal["rounds", "static", "balanced"] = "rounds"
    chunk_tokens: int | None = 1024  # balanced: new tokens per request (trainer/placement.py)
    locality_wait_s: float = 2.0  # balanced: wait for the engine holding the prefix, then move
    backend: Literal["hf", "vllm"] = "hf"  # vllm: the `vllm` section, GPUs and the gpu extra
    # vllm colocated, several ranks: own: each rank's scheduler places its share of the groups
    # on its own engine; shared: rank 0's places every turn on every rank's engine, the others
    # serving theirs (trainer/engines.py)
    engines: Literal["own", "shared"] = "own"


@dataclass(frozen=True)
class PromptConfig:
    # plain: our tool description, bare assistant turns; release: the release's chat template
    # (its tool description, each assistant turn opened with <reason>), what its SFT and RL
    # checkpoints were trained on (trainer/chat.py)
    style: PromptStyle = "plain"


@dataclass(frozen=True)
class RewardConfig:
    # reward only a \boxed{} inside <answer>...</answer> (the report); false: the last box
    # anywhere in the model's text (the release)
    require_answer_tag: bool = False
    # a truncated rollout (length or turn limit) scores 0 (the report); false: its text is
    # scored as it stands (the release)
    zero_truncated: bool = True


@dataclass(frozen=True)
class VllmConfig:
    """The vLLM rollout engines (``rollout.backend: vllm``; docs/gpu.md has the layouts)."""

    layout: Literal["colocated", "separate"] = "colocated"
    # colocated: every trainer rank hosts one engine on its own GPU, asleep while it trains;
    # separate: trainer rank 0 hosts one engine of data_parallel_size replicas on `devices`.
    devices: str | None = None  # separate: CUDA_VISIBLE_DEVICES of the engine, e.g. "4,5,6,7"
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1  # separate: replicas in the engine, balanced by vLLM itself
    gpu_memory_utilization: float = 0.5  # of the whole GPU, KV cache included
    max_model_len: int = 16384
    enable_prefix_caching: bool = True
    seed: int = 0  # each rank's engine adds its rank
    dtype: str = "bfloat16"
    enforce_eager: bool = False  # no CUDA graphs: faster start, slower decode
    max_num_seqs: int | None = None  # concurrent sequences per replica; None: vLLM's default
    sleep_level: int = 0  # colocated: 0 stay awake, 1 offload weights to CPU, 2 discard them
    bucket_mb: int = 512  # gathered weights held at once during a push
    nccl_port: int = 29600  # separate: the NCCL weight-transfer rendezvous port on rank 0


@dataclass(frozen=True)
class ToolConfig:
    sandbox_url: str | None = None  # None: start an embedded service; "subprocess": unsandboxed
    timeout_s: float = 10.0
    memory_mb: int = 1024
    mode: Literal["script", "repl"] = "repl"  # repl: a final expression's repr is printed (release)
    max_response_chars: int = 2048  # a tool response longer than this is cut
    truncate_side: TruncateSide = "middle"
    # Asynchronous schedulers: a batch request to the service leaves when it holds batch_size
    # calls or batch_timeout_s after its oldest call arrived.
    batch_size: int = 64
    batch_timeout_s: float = 0.01


RocVariant = Literal["sample", "release"]  # trainer/roc.py


@dataclass(frozen=True)
class RocConfig:
    # false: keep G of the oversample * G rollouts uniformly at random (with oversample 1: all
    # G, plain GRPO); the controls of docs/trainer.md
    enabled: bool = True
    variant: RocVariant = "sample"  # sample: the report's rule; release: rStar's (trainer/roc.py)
    use_error_ratio: bool = True
    use_answer_format: bool = True
    min_penalty: float = 1e-3  # sample only: the floor under p_total (1 / p_total weights)
    # per-class minimum counts kept when both classes exist (the release's script: 2 and 2)
    min_positives: int = 1
    min_negatives: int = 1
    drop_equal_reward: bool = True  # groups whose rewards are all equal leave the step


@dataclass(frozen=True)
class LossConfig:
    eps_low: float = 0.2
    eps_high: float = 0.28
    aggregation: Aggregation = "token_mean"
    dual_clip_c: float | None = None
    kl_coef: float = 0.0
    entropy_coef: float = 0.0

    @property
    def clip(self) -> ClipSettings:
        return ClipSettings(self.eps_low, self.eps_high, self.dual_clip_c)


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-6
    warmup_steps: int = 20  # linear warm-up over RL steps, then constant
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01  # verl's default, so the release's; the report does not say
    grad_clip: float = 1.0
    micro_batch_tokens: int = 16384  # padded tokens per forward/backward
    mini_batches: int = 1  # optimizer steps per RL step (1: fully on-policy, as the release)
    epochs: int = 1  # passes over the step's rollouts


@dataclass(frozen=True)
class StageConfig:
    name: str
    steps: int
    max_response_tokens: int | None = None  # None: rollout.max_response_tokens
    max_turns: int | None = None  # None: rollout.max_turns
    hard_only: bool = False  # keep only problems the current policy does not always solve
    hard_filter_samples: int = 8  # rollouts per problem when filtering (the report: 8)
    hard_filter_max_problems: int | None = None  # filter (and train on) at most this many
    # On entering this stage from an earlier one (the report does both before stage 3): clear
    # AdamW's moments and step count (the learning-rate schedule goes on), and make the
    # reference policy (used when loss.kl_coef > 0) a copy of the policy as it is now.
    reset_optimizer: bool = False
    reset_reference: bool = False


@dataclass(frozen=True)
class SftConfig:
    enabled: bool = False  # in train.py, before RL (one process); else: python -m trainer.sft
    # JSONL / JSON / parquet of conversations in any format of trainer/sft_data.py (OpenAI
    # messages with tool calls, ShareGPT with function_call/observation, xLAM); "toy":
    # generated toy-task transcripts
    data: str = "toy"
    format: SftFormat = "auto"  # auto: each row's shape says
    toy_transcripts: int = 512
    toy_direct_share: float = 0.5  # toy transcripts that answer without calling the tool
    steps: int = 200  # optimizer steps on random batches, unless epochs is set
    epochs: int | None = None  # passes over the data in shuffled batches (the report: 3)
    max_tokens: int | None = None  # drop conversations longer than this (None: keep all)
    batch_size: int = 16  # conversations per optimizer step
    lr: float = 1e-3
    warmup_steps: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    # Stop early once the model writes the final turn of held-out transcripts (toy: the answer
    # after the tool's output, which it must copy) right with this probability, sampled at
    # temperature 1; checked every check_every steps; sft.steps is then the most. None: always
    # sft.steps.
    stop_probability: float | None = None
    check_every: int = 100
    check_transcripts: int = 64
    # toy: a curriculum. First the transcripts with the tool only (sft.steps at most, until
    # stop_probability), so that nothing competes with learning to copy the tool's number;
    # then mix_steps steps on the mix of toy_direct_share, which teaches answering directly.
    toy_copy_first: bool = False
    mix_steps: int = 300


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation while training: avg@k on ``data.eval`` (the release evaluates every 5 steps)."""

    every: int = 0  # RL steps between evaluations (and one after the last step); 0: never
    k: int = 4  # rollouts per problem: the pass rate is avg@k (the report's AIME: avg@16)
    max_problems: int | None = None  # the first N problems of data.eval; None: all
    temperature: float | None = None  # None: rollout.temperature


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = 50  # RL steps; 0: only at the end
    keep: int = 2  # newest checkpoints kept


@dataclass(frozen=True)
class LoggingConfig:
    progress: bool = True
    sample_every: int = 0  # print one decoded rollout every N steps (0: never)
    tensorboard: bool = True  # OUTPUT/tensorboard/ too, when the tensorboard package is installed
    wandb_project: str | None = None  # W&B too, when wandb is installed (or set WANDB_PROJECT)


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    tool: ToolConfig = field(default_factory=ToolConfig)
    vllm: VllmConfig = field(default_factory=VllmConfig)
    roc: RocConfig = field(default_factory=RocConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    stages: tuple[StageConfig, ...] = (StageConfig(name="main", steps=100),)
    sft: SftConfig = field(default_factory=SftConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("stages: at least one stage")
        if self.rollout.group_size < 2:
            raise ValueError("rollout.group_size: at least 2 (advantages compare within a group)")
        if self.rollout.oversample < 1:
            raise ValueError("rollout.oversample: at least 1")
        if self.rollout.chunk_tokens is not None and self.rollout.chunk_tokens < 1:
            raise ValueError("rollout.chunk_tokens: at least 1, or null for whole turns")
        if self.tool.batch_size < 1 or self.tool.batch_timeout_s < 0:
            raise ValueError("tool.batch_size: at least 1; tool.batch_timeout_s: not negative")
        roc = self.roc
        if min(roc.min_positives, roc.min_negatives) < 0 or (
            roc.min_positives + roc.min_negatives > self.rollout.group_size
        ):
            raise ValueError("roc.min_positives + roc.min_negatives: at most rollout.group_size")
        ignored = ignored_options(self)
        if ignored:
            raise ValueError(
                "options that would do nothing here (remove them, or choose what uses them): "
                + "; ".join(f"{path}: {why}" for path, why in ignored)
            )
        if self.eval.every < 0 or self.eval.k < 1:
            raise ValueError("eval.every: not negative; eval.k: at least 1")
        if self.eval.every and self.data.eval is None:
            raise ValueError("eval.every: needs data.eval, the held-out problems")

    @property
    def total_steps(self) -> int:
        return sum(stage.steps for stage in self.stages)


def ignored_options(config: TrainConfig) -> list[tuple[str, str]]:
    """The options set away from their defaults that the rest of ``config`` leaves unread, each
    with why: (path, reason). A run that sets one believes it changed something."""
    out = _ignored_by_rollout(config)
    if config.loss.kl_coef == 0:
        out += [
            (f"stages[{i}].reset_reference", "no reference policy with loss.kl_coef 0")
            for i, stage in enumerate(config.stages)
            if stage.reset_reference
        ]
    roc, default = config.roc, RocConfig()
    if not roc.enabled:
        selection = ("variant", "min_positives", "min_negatives", "min_penalty")
        out += [
            (f"roc.{name}", "roc.enabled false keeps G uniformly at random")
            for name in _changed(roc, default, selection)
        ]
    elif roc.variant == "release" and roc.min_penalty != default.min_penalty:
        out.append(("roc.min_penalty", "the release variant sorts by penalty, it does not weight"))
    return out


def _ignored_by_rollout(config: TrainConfig) -> list[tuple[str, str]]:
    rollout, default = config.rollout, RolloutConfig()
    out = []
    if rollout.scheduler == "rounds":
        out += [
            (f"tool.{name}", "rollout.scheduler rounds sends a round's calls at once")
            for name in _changed(config.tool, ToolConfig(), ("batch_size", "batch_timeout_s"))
        ]
    if rollout.scheduler != "balanced":
        out += [
            (f"rollout.{name}", f"only balanced placement reads it, not {rollout.scheduler}")
            for name in _changed(rollout, default, ("chunk_tokens", "locality_wait_s"))
        ]
    elif rollout.backend == "hf" and rollout.chunk_tokens != default.chunk_tokens:
        out.append(("rollout.chunk_tokens", "the hf backend reports no KV cache to chunk by"))
    layout = (rollout.backend, config.vllm.layout)
    if rollout.engines == "shared" and layout != ("vllm", "colocated"):
        out.append(("rollout.engines", "only colocated vLLM engines are one per rank to share"))
    return out


def _changed(section: object, default: object, names: tuple[str, ...]) -> list[str]:
    return [name for name in names if getattr(section, name) != getattr(default, name)]


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """The config of a YAML file (None: all defaults), with ``overrides`` (dotted keys) on top."""
    data: dict[str, Any] = {}
    if path is not None:
        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: the top level must be a mapping")
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return from_dict(TrainConfig, data)


def to_dict(config: object) -> dict[str, Any]:
    """A plain dict (tuples as lists) that ``load_config`` reads back to an equal config."""

    def plain(value: Any) -> Any:
        if isinstance(value, tuple | list):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return plain(dataclasses.asdict(config))  # type: ignore[call-overload]


def save_config(config: TrainConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(config), sort_keys=False))


def from_dict(cls: type, data: Any, where: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, checking every key and value against its type."""
    if not isinstance(data, dict):
        raise ValueError(f"{where or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{where or 'config'}: unknown key(s) {unknown}; known: {sorted(names)}")
    required = {
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    missing = sorted(required - set(data))
    if missing:
        raise ValueError(f"{where or 'config'}: missing key(s) {missing}")
    kwargs = {
        key: _convert(hints[key], value, f"{where}.{key}".lstrip("."))
        for key, value in data.items()
    }
    return cls(**kwargs)


def _convert(hint: Any, value: Any, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, where)  # type: ignore[arg-type]
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(arg, value, where)
            except ValueError as exc:
                errors.append(str(exc))
        raise ValueError("; ".join(errors))
    if origin is Literal:
        if value not in args:
            raise ValueError(f"{where}: {value!r} is not one of {list(args)}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ValueError(f"{where}: expected a list, got {value!r}")
        items = args[:1] * len(value) if len(args) == 2 and args[1] is Ellipsis else args
        if len(items) != len(value):
            raise ValueError(f"{where}: expected {len(items)} items, got {len(value)}")
        return tuple(
            _convert(a, v, f"{where}[{i}]")
            for i, (a, v) in enumerate(zip(items, value, strict=True))
        )
    return _scalar(hint, value, where)


def _scalar(hint: Any, value: Any, where: str) -> Any:
    if hint is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, str):  # YAML reads 1e-6 (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    if (
        hint in (int, str, bool)
        and isinstance(value, hint)
        and not (hint is int and isinstance(value, bool))
    ):
        return value
    raise ValueError(f"{where}: expected {getattr(hint, '__name__', hint)}, got {value!r}")
