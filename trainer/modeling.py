"""The policy: a causal LM and its tokenizer on one device, and the precision it computes in.

``model.path: tiny`` builds a tiny Qwen2 and a tokenizer trained on the toy task (nothing is
downloaded); any other path is loaded with transformers' ``from_pretrained``. Checkpoints are
written with ``save_pretrained``, so a checkpoint's ``model/`` directory is itself a path.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from trainer.config import ModelConfig
from trainer.tiny_model import build_model, build_tokenizer
from trainer.toy_task import tokenizer_corpus

TINY = "tiny"
PLAIN_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


@dataclass
class Policy:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    dtype: torch.dtype | None  # autocast dtype; None: full float32

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def save(self, directory: str | Path) -> None:
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """bf16 autocast where the device does it well (a GPU with bf16); float32 on CPU by
    default, where bf16 matmuls are slow and a tiny model gains nothing."""
    if precision == "float32":
        return None
    if precision == "bfloat16":
        return torch.bfloat16
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


def load_policy(config: ModelConfig, path: str | Path | None = None, seed: int = 0) -> Policy:
    """The policy of ``config`` (or of the directory ``path``, e.g. a checkpoint's model)."""
    device = resolve_device(config.device)
    model, tokenizer = load_model(config, path, seed)
    model.to(device)  # type: ignore[arg-type]  # transformers wraps .to; stubs disagree
    return prepare_policy(config, model, tokenizer, device)


def load_model(
    config: ModelConfig, path: str | Path | None = None, seed: int = 0, empty: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model (float32, on the CPU) and tokenizer of ``config`` or of the directory ``path``.

    ``empty``: the model's structure on the meta device, without weights (no memory, no
    reading of weight files): what a sharded run's ranks build before rank 0's weights
    reach their shards (``fsdp.load_sharded_policy``)."""
    source = str(path) if path is not None else config.path
    tokenizer: PreTrainedTokenizerBase
    model: PreTrainedModel
    where = torch.device("meta") if empty else contextlib.nullcontext()
    if source == TINY:
        tokenizer = build_tokenizer(tokenizer_corpus(), config.tiny.vocab_size)
        with _seeded(seed), where:
            model = build_model(tokenizer, config.tiny)
    else:
        tokenizer = load_tokenizer(source)
        if empty:
            with where:
                model = AutoModelForCausalLM.from_config(
                    AutoConfig.from_pretrained(source), dtype=torch.float32
                )
        else:
            model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def prepare_policy(
    config: ModelConfig,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    device: torch.device,
) -> Policy:
    """Set a loaded model up for training on ``device`` (where it is, or will be)."""
    if device.type == "cpu" and config.cpu_threads > 0:
        torch.set_num_threads(config.cpu_threads)
    model.config.use_cache = False  # training forwards; generate turns the cache on itself
    if config.gradient_checkpointing:
        enable_activation_checkpointing(model)
    model.train()
    return Policy(model, tokenizer, device, autocast_dtype(config.precision, device))


def enable_activation_checkpointing(model: PreTrainedModel) -> None:
    """Recompute activations in the backward pass (memory for compute); non-reentrant, the
    variant that works with frozen inputs and autocast."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5
        model.activation_checkpointing_enable(kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def load_tokenizer(directory: str) -> PreTrainedTokenizerBase:
    """The tokenizer saved with a model. A plain tokenizers-backed one (as ``tiny`` builds) is
    loaded as such: ``AutoTokenizer`` would pick the model family's class (``Qwen2Tokenizer``
    for a qwen2 config), which rebuilds the pre-tokenizer its own way and splits text
    differently from the tokenizer the model was trained with."""
    config_file = Path(directory) / "tokenizer_config.json"
    if config_file.exists():
        saved_class = json.loads(config_file.read_text()).get("tokenizer_class")
        if saved_class in PLAIN_TOKENIZER_CLASSES:
            return PreTrainedTokenizerFast.from_pretrained(directory)
    return AutoTokenizer.from_pretrained(directory)


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Run with torch's global generator seeded, then give the caller its own state back."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.random.set_rng_state(state)
