"""A hidden-states KV connector for vLLM CPU only: never the GPU path.

vLLM's `ExampleHiddenStatesConnector` (hs_connectors' `file` backend) copies each finished request's hidden
states from the KV cache to pinned host memory on a CUDA stream and reports the request done once the copy's
event completes. On vLLM CPU both steps break: `torch.empty_like(..., pin_memory=True)` has no pinned-memory
allocator (RuntimeError), and vLLM CPU's `_EventPlaceholder` stand-in for `torch.cuda.Event` has no
`query()` (AttributeError). `CpuHiddenStatesConnector` copies the rows out of the (host) KV cache with plain
indexing, which makes a fresh tensor that later steps do not overwrite, and treats the copy as done at once.
Everything else, the file names, the `.lock` file a client waits on, the writer threads and the scheduler
side, is the parent's, so clients (speculators' `vllm_client`, hs_connectors' `FileTransfer`) see the same
files as on a GPU.

vLLM loads it out of tree (`kv_connector_module_path`) in its own environment, where eagle3_pipeline is not
installed: this module imports only vLLM, torch and the standard library, and the stage copies it into a
directory of its own that goes on the server's PYTHONPATH (`eagle3_pipeline.serving.kv_transfer`). A GPU
engine uses hs_connectors' connectors unchanged.
"""

from __future__ import annotations

import fcntl
import os
from functools import partial

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class CopyDone:
    """The 'device-to-host copy finished' event of a CPU engine: the hidden states are host memory already."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


def slot_mapping(block_ids: list[int], block_size: int) -> torch.Tensor:
    """The KV cache slots of a request's blocks, in token order (as the parent computes them)."""
    blocks = torch.tensor(block_ids, dtype=torch.long)
    offsets = torch.arange(0, block_size, dtype=torch.long)
    return (offsets.reshape(1, block_size) + blocks.reshape(-1, 1) * block_size).flatten()


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):  # type: ignore[misc]  # vLLM is untyped here
    """`ExampleHiddenStatesConnector` without pinned memory or CUDA streams and events (vLLM CPU only)."""

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        slots = slot_mapping(pending.block_ids, self._block_size)
        # advanced indexing copies: the blocks may be reused as soon as get_finished reports the request
        hidden_states = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0])
        tensors = {"hidden_states": hidden_states, "token_ids": pending.token_ids.clone()}
        assert pending.req_id not in self._req_futures, "another KV transfer request with the same req_id"
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)  # pre-created in wait_for_save
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = CopyDone()
        future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
