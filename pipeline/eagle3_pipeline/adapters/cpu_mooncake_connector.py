"""hs_connectors' Mooncake hidden-states connector for vLLM CPU only: never the GPU path.

`MooncakeHiddenStatesConnector` (hs_connectors' `mooncake` backend) resolves the active accelerator's torch
module (`hs_connectors.device.accelerator_module`) for a copy stream and a "forward pass done" event; on vLLM
CPU there is no accelerator and the engine fails to start (`RuntimeError: No accelerator is available.`, from
`register_kv_caches`). `CpuMooncakeHiddenStatesConnector` hands it `torch.cpu` instead, torch's own
device-agnostic stand-ins: `Stream`, `Event` (`record`, `query` -> True) and `stream(...)` do nothing, which
is right on a CPU engine, whose forward pass has finished when `get_finished` runs. The store falls back to
pageable staging memory by itself (a warning). Everything else, the Mooncake keys, the transfer manifest in
the response's `kv_transfer_params`, the writer threads, the error markers and the scheduler side, is the
parent's, so the trainer (hs_connectors' `MooncakeTransfer`) reads the same objects as from a GPU producer.

vLLM loads it out of tree (`kv_connector_module_path`) in its own environment, where eagle3_pipeline is not
installed: this module imports only torch, hs_connectors and the standard library (vLLM through
hs_connectors), and goes on the server's PYTHONPATH alone, as `cpu_hidden_states_connector` does. A GPU
engine uses hs_connectors' connector unchanged.
"""

from __future__ import annotations

from types import ModuleType

import torch
from hs_connectors.mooncake_hidden_states_connector import MooncakeHiddenStatesConnector


class CpuMooncakeHiddenStatesConnector(MooncakeHiddenStatesConnector):
    """`MooncakeHiddenStatesConnector` with torch's CPU stream and event stand-ins (vLLM CPU only)."""

    def _device(self) -> ModuleType:
        return torch.cpu
