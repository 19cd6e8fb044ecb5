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
directory of its own that goes on the server's PYTHONPATH (`eagle3_pipeline.serving.kv_transfer`), with the
project's patch guard beside it (eagle3_contract.patch_guard, standard library only, as `eagle3_patch_guard`).
The guard is checked when vLLM imports this module: on another vLLM, or where the parent's code changed, the
engine does not start, and the message names what changed. A GPU engine uses hs_connectors' connectors
unchanged.
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

try:  # the project's environment (its tests)
    from eagle3_contract.patch_guard import PatchGuard, Source
except ImportError:  # vLLM's own environment: the stage copies the guard beside this module
    from eagle3_patch_guard import PatchGuard, Source  # type: ignore[no-redef,import-not-found]

PARENT = "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"
GUARD = PatchGuard(
    patch=__name__,
    distribution="vllm",
    version="0.32.0",
    sources=(
        Source(
            f"{PARENT}:ExampleHiddenStatesConnector._submit_async_write",
            "c78aab32eff848cba501928c496174b513f25ddb239558022607beb69320d550",
            "the method replaced: its lock file, writer submission and bookkeeping, less the pinned copy",
        ),
        Source(
            f"{PARENT}:ExampleHiddenStatesConnector.get_finished",
            "0680a81026cc32888be29b23146a1715717c7477a5262327c11f4f8f767418d5",
            "a request is reported done once its copy event's query() is True (CopyDone)",
        ),
        Source(
            f"{PARENT}:ExampleHiddenStatesConnector._write_tensors",
            "7877e27c5cc077a2372dff8c96976c2ab6b2320ad656cf756034d71fb9cb7df3",
            "called with (tensors, event, filename, lock_fd); it waits on the event with synchronize()",
        ),
        Source(
            f"{PARENT}:ExampleHiddenStatesConnector._on_write_done",
            "a29bf799aa06b62ec6f8e4286f881d52c482e16e890c9d412625c75f7ff823b7",
            "the future's done callback, given the request id",
        ),
        Source(
            f"{PARENT}:ExampleHiddenStatesConnector.wait_for_save",
            "90fb5bfc34d2d5b16e3f7c872463c7ed182f8720384b06d8301ca34c9421c021",
            "pre-creates the request's lock file in _lock_fds and calls _submit_async_write",
        ),
        Source(
            f"{PARENT}:extract_from_kv_cache",
            "c6f0730362d095fb6637a68b64f7ab11a141f22f70c4496a01e06ce0e69449f2",
            "reads a request's hidden states out of the KV cache by slot (advanced indexing: a copy)",
        ),
        Source(
            f"{PARENT}:PendingSave",
            "f3faab86b578da58d412c093b0681f158e78f953a34e9c998ea9cc9df51eeef2",
            "req_id, block_ids, token_ids and filename of a request to save",
        ),
    ),
    remove_when="vLLM's ExampleHiddenStatesConnector runs on vLLM CPU (no pinned memory, an event with "
    "query())",
)
GUARD.check()


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
