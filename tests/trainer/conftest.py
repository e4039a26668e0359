"""Shared fixtures of the trainer tests."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from trainer.tiny import build_tokenizer
from trainer.toy import tokenizer_corpus


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer(tokenizer_corpus(128), vocab_size=1024)
