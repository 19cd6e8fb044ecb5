"""Every adaptation that lets speculators' EAGLE-3 trainer run on a machine without an accelerator.

speculators 0.9.0 assumes a GPU in exactly three places (everything else runs on the CPU as is):
  1. `Trainer` moves the model and every batch to `get_local_rank()` (device 0, i.e. CUDA);
  2. `SingleGPUCheckpointer` loads a checkpoint onto `get_current_device()` ("cuda:0" without an accelerator);
  3. the step timer calls `torch.accelerator.synchronize()`, which raises when there is no accelerator.
`cpu_adapted()` redirects the first two to "cpu" and makes the third a no-op (there is nothing to wait for),
only while training and only when no accelerator is present; on a GPU it changes nothing.

Under torchrun (several processes, `training.nodes` > 1 on the CPU), a fourth: speculators'
`maybe_setup_distributed` sets the accelerator's device and asks it for its backend (NCCL), and raises
"No accelerator found" on the CPU. `setup_distributed()` does what it does with gloo instead: it starts the
process group and fills in speculators' topology (rank, world size, its data- and sequence-parallel groups)
as that function would. The rest runs on the CPU as is: speculators trains DDP-style by default (`fsdp_shard`
stays off), which gloo and CPU tensors support, and its rank-0-only saves, barriers and metric all-reduces
are plain collectives. Two settings that
also differ on CPU are chosen by the caller, not patched: SDPA attention (flex attention has no CPU backward)
and the eager loss (the fused one needs Triton). Autocast stays as speculators sets it ("cuda", which torch
disables on a CPU-only machine): the CPU computes in float32. One more on a CPU without native bfloat16
(eagle3_pipeline.runtime.host_cpu): Muon's Newton-Schulz iterations, which torch computes in bfloat16, run in
float32 (eagle3_pipeline.adapters.muon_float32).

The adaptation is written against speculators==0.9.0: before patching, its `GUARD` checks that version and
the source of every call site above (eagle3_contract.patch_guard), so an upgrade fails loudly here instead of
training on the wrong device or not at all.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from eagle3_contract.patch_guard import PatchGuard, Source
from eagle3_pipeline.adapters import muon_float32

logger = logging.getLogger(__name__)

CPU = "cpu"


GUARD = PatchGuard(
    patch=__name__,
    distribution="speculators",
    version="0.9.0",
    # What the patches rely on: the call sites that go to the accelerator, as speculators 0.9.0 writes them.
    sources=(
        Source(
            "speculators.train.trainer:Trainer.__init__",
            "c323c45e45491c7375a0ba3af91f5494af7ba21d57dd39ce4fdd6f78c78fcd6d",
            "the trainer's device is trainer.get_local_rank() (patched to 'cpu'); its autocast device is "
            "'cuda' without an accelerator (cpu_autocast sets 'cpu')",
        ),
        Source(
            "speculators.train.trainer:Trainer.setup_model",
            "b250d0e72b307722911a400e43824923a71942393ac74bbfbb9be35be1060938",
            "the model is moved to self.local_rank",
        ),
        Source(
            "speculators.train.trainer:Trainer.train_epoch",
            "a84f3c8000da1b71a9a0eab955b0398ce23b717986df94b65b9f6c71c054ac8c",
            "training batches are moved to self.local_rank and autocast to self.device_type",
        ),
        Source(
            "speculators.train.trainer:Trainer.val_epoch",
            "10da9d3279842a4c5316aea0d9e563a2667a78efee172ab066a14b0ba84a4b44",
            "validation batches are moved to self.local_rank",
        ),
        Source(
            "speculators.train.trainer:_StepTimer.mark",
            "5d798b0a65c2de110f4f93655402e91bf737d3bbddf86bb6ad4f158a164ebf0e",
            "the step timer calls torch.accelerator.synchronize() (a no-op without an accelerator)",
        ),
        Source(
            "speculators.train.trainer:_StepTimer.now",
            "e47c9a9e6c78ac8c6b55850529f09159418baa06f1589610264f62c8fe476581",
            "the step timer calls torch.accelerator.synchronize() (a no-op without an accelerator)",
        ),
        Source(
            "speculators.train.checkpointer:SingleGPUCheckpointer.load_model_state_dict",
            "ee677396facb87fbb732d9dd4de5a2726cf543600fb9f5eb50b75e2eaa0ef1b9",
            "resuming loads weights onto checkpointer.get_current_device() (patched to 'cpu')",
        ),
        Source(
            "speculators.train.checkpointer:SingleGPUCheckpointer.load_optimizer_state_dict",
            "3145716bb1072077e9427b5783437f65ae1b1cd2ecddd1dc174e1fc50310f068",
            "resuming loads the optimizer state onto checkpointer.get_current_device() (patched to 'cpu')",
        ),
        Source(
            "speculators.train.distributed:maybe_setup_distributed",
            "ce8ff9c12a247fe797346cfd7b3fc852c6f2b0632676a01249b02fe9f77acf8c",
            "setup_distributed sets the topology it sets (_local_rank, _is_distributed, _rank, _world_size, "
            "_init_sp_process_groups), with gloo",
        ),
    ),
    remove_when="speculators trains without an accelerator by itself (the trainer and checkpointer take "
    "the CPU, the step timer does not synchronize, and maybe_setup_distributed uses gloo there)",
)

# (module, attribute) replaced while training on the CPU, with the value each takes.
PATCHES: tuple[tuple[str, str, Callable[..., Any]], ...] = (
    ("speculators.train.trainer", "get_local_rank", lambda: CPU),
    ("speculators.train.checkpointer", "get_current_device", lambda: CPU),
    ("torch.accelerator", "synchronize", lambda *args, **kwargs: None),
)


def patches(native_bfloat16: bool) -> tuple[tuple[str, str, Callable[..., Any]], ...]:
    """PATCHES, and Muon's Newton-Schulz iterations in float32 on a CPU without native bfloat16."""
    if native_bfloat16:
        return PATCHES
    return (*PATCHES, (muon_float32.MODULE, muon_float32.FUNCTION, muon_float32.newton_schulz_float32))


def has_accelerator() -> bool:
    return bool(torch.accelerator.is_available())


@contextlib.contextmanager
def cpu_adapted(native_bfloat16: bool = True) -> Iterator[bool]:
    """Within the block, speculators' trainer runs on the CPU when there is no accelerator (`native_bfloat16`:
    whether the CPU computes bfloat16 natively; eagle3_pipeline.runtime.host_cpu tells).

    Yields whether it does; on a machine with an accelerator nothing is patched.
    """
    if has_accelerator():
        yield False
        return
    GUARD.check()
    if not native_bfloat16:
        muon_float32.GUARD.check()
    saved = []
    try:
        chosen = patches(native_bfloat16)
        for module_name, attribute, value in chosen:
            module = importlib.import_module(module_name)
            saved.append((module, attribute, getattr(module, attribute)))
            setattr(module, attribute, value)
        with warnings.catch_warnings():
            # speculators autocasts to "cuda", which torch disables (with this warning) on a CPU-only machine
            warnings.filterwarnings("ignore", message=".*CUDA is not available.*Disabling")
            warnings.filterwarnings("ignore", message=".*pin_memory.*no accelerator is found")
            logger.info(
                "no accelerator: training on the CPU (speculators %s, adapted; %s)",
                GUARD.version,
                "native bfloat16"
                if chosen is PATCHES
                else "no native bfloat16: Muon's iterations in float32",
            )
            yield True
    finally:
        for module, attribute, original in reversed(saved):
            setattr(module, attribute, original)


def cpu_autocast(trainer: Any) -> None:
    """Autocast the trainer's forward passes on the CPU, in its hidden_states_dtype (bfloat16), as it does on
    a GPU: master weights stay float32, the matrix products run in bfloat16. speculators names the device
    "cuda" when there is no accelerator, which torch disables (float32 throughout). For a CPU with native
    bfloat16 only: one without it runs bfloat16 products about 100x slower than float32 ones."""
    trainer.device_type = CPU


def fork_loader_workers(loaders: tuple[Any, ...]) -> None:
    """Without an accelerator, the loaders' workers are forked, not spawned (speculators spawns them always).

    Spawn exists for CUDA, whose state a fork would copy broken; without an accelerator there is none, and
    fork is torch's own default on Linux. A spawned worker re-imports torch, transformers and speculators,
    about 14 CPU-s each on this 2-core machine, and online training has 4 workers for training and 4 more for
    validation: a minute of both cores before the first step and again before the first validation. A forked
    one starts in milliseconds, with this process's patches (PATCHES) in place. The workers set up their
    producer client and transfer lazily, after the fork (speculators' `_setup_client`).
    """
    if has_accelerator():
        return
    for loader in loaders:
        if loader.num_workers > 0:
            loader.multiprocessing_context = "fork"


def setup_distributed() -> None:
    """speculators' `maybe_setup_distributed()`, on the CPU with gloo where there is no accelerator.

    Outside torchrun (no LOCAL_RANK), or with an accelerator, it is speculators' own function.
    `maybe_destroy_distributed()` undoes either.
    """
    from speculators.train import distributed

    if has_accelerator() or "LOCAL_RANK" not in os.environ:
        distributed.maybe_setup_distributed()
        return
    GUARD.check()
    import torch.distributed as dist

    dist.init_process_group("gloo")
    distributed._local_rank = int(os.environ["LOCAL_RANK"])
    distributed._is_distributed = True
    distributed._rank = dist.get_rank()
    distributed._world_size = dist.get_world_size()
    distributed._init_sp_process_groups(distributed._rank, distributed._world_size, 1)
    logger.info("no accelerator: rank %d of %d on the CPU (gloo)", dist.get_rank(), dist.get_world_size())
