"""Shared fixtures of the trainer tests."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from trainer.tiny_model import build_tokenizer
from trainer.toy_task import tokenizer_corpus


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer(tokenizer_corpus(128), vocab_size=1024)


# The tiny models gain nothing from a second thread, and on a shared two-core machine a
# second thread spinning in OpenMP slows everything else down.
torch.set_num_threads(1)
