"""The `--kv-transfer-config` of a `vllm serve` extracting hidden states (extract stage, `eagle3 produce`).

The config is hs_connectors' own: a backend's `build_kv_transfer_config` of its launch arguments, parsed as
speculators' scripts/launch_vllm.py parses them (`file` and `fp8` write safetensors files to a directory;
`mooncake` puts samples in a Mooncake store). On vLLM CPU (no accelerator) the connectors are swapped for
CPU subclasses: `CpuHiddenStatesConnector` (eagle3_pipeline/adapters/cpu_hidden_states_connector.py: same
files, none of the CUDA calls of vLLM's connector) and `CpuMooncakeHiddenStatesConnector`
(eagle3_pipeline/adapters/cpu_mooncake_connector.py: hs_connectors' own, on torch.cpu's no-op streams and
events). vLLM imports them from its own environment, where eagle3_pipeline is not installed:
`cpu_connector_env` copies the two modules alone, with their patch guard, into a directory and puts that on
the server's PYTHONPATH (the package's own directory would expose every eagle3_pipeline module as a top-level
name there).
"""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eagle3_contract import patch_guard
from eagle3_pipeline import adapters
from eagle3_pipeline.runtime.errors import StageError

FILE = "file"
FP8 = "fp8"
MOONCAKE = "mooncake"
CPU_CONNECTOR = "CpuHiddenStatesConnector"
CPU_CONNECTOR_MODULE = "cpu_hidden_states_connector"
CPU_CONNECTOR_SOURCE = Path(adapters.__file__).with_name(f"{CPU_CONNECTOR_MODULE}.py")
CPU_MOONCAKE_CONNECTOR = "CpuMooncakeHiddenStatesConnector"
CPU_MOONCAKE_MODULE = "cpu_mooncake_connector"
CPU_MOONCAKE_SOURCE = Path(adapters.__file__).with_name(f"{CPU_MOONCAKE_MODULE}.py")
# The name the connectors import their guard by in vLLM's environment (a copy of eagle3_contract.patch_guard).
PATCH_GUARD_MODULE = "eagle3_patch_guard"
# On a CPU machine each Mooncake client (a producer, the trainer) lends this much memory to the store, not
# hs_connectors' 4 GiB + 2 GiB of a GPU node: the tiny samples of a CPU run fit many times over.
CPU_MOONCAKE_SEGMENT_GIB = 0.25
CPU_MOONCAKE_BUFFER_GIB = 0.125
CPU_MOONCAKE_ARGS = [
    *("--mooncake-global-segment-gib", str(CPU_MOONCAKE_SEGMENT_GIB)),
    *("--mooncake-local-buffer-gib", str(CPU_MOONCAKE_BUFFER_GIB)),
]


def hs_connectors_config(backend: str, launch_args: list[str]) -> dict[str, Any]:
    """hs_connectors' `build_kv_transfer_config` of `backend`, its launch arguments parsed (with defaults)."""
    from hs_connectors import HiddenStatesBackend

    cls = HiddenStatesBackend.registry[backend]
    parser = argparse.ArgumentParser(prog=f"hs_connectors {backend}")
    cls.add_launch_args(parser)
    config: dict[str, Any] = cls.build_kv_transfer_config(parser.parse_args(launch_args))
    return config


def files_config(backend: str, directory: Path, *, cpu: bool) -> dict[str, Any]:
    """The `file` or `fp8` backend writing to `directory`; on vLLM CPU (`cpu`) the CPU connector."""
    config = hs_connectors_config(backend, ["--hidden-states-path", str(directory)])
    if not cpu:
        return config
    if backend != FILE:
        raise StageError(
            f"hidden states in {backend} need vLLM with an accelerator (hs_connectors' connector copies "
            "them through CUDA streams); vLLM CPU writes bfloat16 or float16 only: set "
            "spec.extraction.dtype to bfloat16 (or use the transformers backend)"
        )
    return cpu_connector_config(config)


def cpu_connector_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """hs_connectors' `file` config with the CPU connector in place of vLLM's ExampleHiddenStatesConnector."""
    return {**config, "kv_connector": CPU_CONNECTOR, "kv_connector_module_path": CPU_CONNECTOR_MODULE}


def mooncake_config(master: str, *, cpu: bool) -> dict[str, Any]:
    """The `mooncake` backend storing samples through the Mooncake master at `master` (`host:port`)."""
    if not cpu:
        return hs_connectors_config(MOONCAKE, ["--mooncake-master", master])
    config = hs_connectors_config(MOONCAKE, ["--mooncake-master", master, *CPU_MOONCAKE_ARGS])
    return {**config, "kv_connector": CPU_MOONCAKE_CONNECTOR, "kv_connector_module_path": CPU_MOONCAKE_MODULE}


def cpu_connector_env(directory: Path, env: Mapping[str, str]) -> dict[str, str]:
    """The environment vLLM CPU needs to import the CPU connectors: their modules alone in `directory`,
    which goes first on PYTHONPATH (after it, `env`'s PYTHONPATH if any). Returns the variables to set."""
    directory.mkdir(parents=True, exist_ok=True)
    for source in (CPU_CONNECTOR_SOURCE, CPU_MOONCAKE_SOURCE):
        shutil.copyfile(source, directory / source.name)
    # their guard (standard library only): vLLM's environment has no eagle3_contract
    shutil.copyfile(patch_guard.__file__, directory / f"{PATCH_GUARD_MODULE}.py")
    existing = env.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join([str(directory), *([existing] if existing else [])])}
