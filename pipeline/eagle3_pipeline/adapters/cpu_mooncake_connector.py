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
hs_connectors), and goes on the server's PYTHONPATH alone, as `cpu_hidden_states_connector` does, with the
project's patch guard beside it (checked when vLLM imports this module). A GPU engine uses hs_connectors'
connector unchanged.
"""

from __future__ import annotations

from types import ModuleType

import torch
from hs_connectors.mooncake_hidden_states_connector import MooncakeHiddenStatesConnector

try:  # the project's environment (its tests)
    from eagle3_contract.patch_guard import PatchGuard, Source
except ImportError:  # vLLM's own environment: the stage copies the guard beside this module
    from eagle3_patch_guard import PatchGuard, Source  # type: ignore[no-redef,import-not-found]

PARENT = "hs_connectors.mooncake_hidden_states_connector:MooncakeHiddenStatesConnector"
GUARD = PatchGuard(
    patch=__name__,
    distribution="hs-connectors",
    version="0.9.0",
    sources=(
        Source(
            f"{PARENT}._device",
            "b696a28c4b7bd63e1b1a321a41e7dd5682d9eb6836ecf8dcdeb3d2bb3ff6ee2a",
            "the method replaced: the one place the accelerator module (Stream, Event, stream()) is resolved",
        ),
    ),
    remove_when="hs_connectors' Mooncake connector falls back to torch.cpu without an accelerator",
)
GUARD.check()


class CpuMooncakeHiddenStatesConnector(MooncakeHiddenStatesConnector):
    """`MooncakeHiddenStatesConnector` with torch's CPU stream and event stand-ins (vLLM CPU only)."""

    def _device(self) -> ModuleType:
        return torch.cpu
