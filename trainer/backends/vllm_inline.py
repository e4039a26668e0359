"""A vLLM weight-transfer backend for engines on the CPU: the tensors ride in the request.

vLLM's own backends move weights between GPUs (``ipc``: CUDA IPC handles; ``nccl``). An engine
on the CPU (vLLM's CPU build) shares neither, so a colocated backend there sends each bucket's
tensors themselves, pickled, through the same four calls (``init_weight_transfer_engine``,
``start_weight_update``, ``update_weights`` per bucket, ``finish_weight_update``) and the same
layerwise reload as ``ipc``: only the transport differs. It is what lets
``tests/trainer/test_vllm_engine.py`` push a policy into a real engine without a GPU.

vLLM loads it as a plugin (the ``vllm.general_plugins`` entry point in pyproject), in every
vLLM process, which registers the backend under ``NAME``; the engine's workers unpickle the
tensors only with ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``, which ``backends.vllm`` sets.
"""

from __future__ import annotations

import base64
import pickle
from dataclasses import dataclass
from typing import Any

import torch
from vllm import envs
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from trainer.backends.vllm import INLINE_TRANSFER as NAME


def payload(names: list[str], tensors: list[torch.Tensor]) -> dict[str, Any]:
    """One bucket as ``update_weights``' update_info."""
    pickled = pickle.dumps([tensor.detach().cpu() for tensor in tensors])
    return {"names": names, "tensors_pickled": base64.b64encode(pickled).decode()}


@dataclass
class InlineInitInfo(WeightTransferInitInfo):
    """Nothing to agree on: there is no channel to open."""


@dataclass
class InlineUpdateInfo(WeightTransferUpdateInfo):
    names: list[str]
    tensors_pickled: str  # base64 of the pickled list of tensors, in ``names``' order

    def tensors(self) -> list[torch.Tensor]:
        if not envs.VLLM_ALLOW_INSECURE_SERIALIZATION:
            raise ValueError(
                "refusing to unpickle weights without VLLM_ALLOW_INSECURE_SERIALIZATION=1"
            )
        tensors = pickle.loads(base64.b64decode(self.tensors_pickled))
        if len(tensors) != len(self.names):
            raise ValueError(f"{len(self.names)} names but {len(tensors)} tensors")
        return tensors


class InlineWeightTransferEngine(WeightTransferEngine[InlineInitInfo, InlineUpdateInfo]):
    init_info_cls = InlineInitInfo
    update_info_cls = InlineUpdateInfo

    def init_transfer_engine(self, init_info: InlineInitInfo) -> None:
        pass

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def receive_weights(self, update_info: InlineUpdateInfo) -> None:
        self.model.load_weights(list(zip(update_info.names, update_info.tensors(), strict=True)))

    def shutdown(self) -> None:
        pass


def register() -> None:
    """The plugin's entry point: make ``NAME`` a weight-transfer backend in this process."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if NAME not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(NAME, InlineWeightTransferEngine)
