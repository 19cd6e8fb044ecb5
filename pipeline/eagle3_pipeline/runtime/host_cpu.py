"""What this machine's CPU offers the stages that compute on it: native bfloat16, and the cores they may use.

**Native bfloat16.** A CPU with AVX512-BF16 or AMX-BF16 (`/proc/cpuinfo` flags `avx512_bf16`, `amx_bf16`)
multiplies bfloat16 matrices faster than float32 ones; one without them converts every operand, and oneDNN's
fallback is far slower than float32 (0.5 against 54.5 GFLOP/s for a 512x576 by 576x8192 matmul on one
thread, issue 30). The stages ask `native_bfloat16()` before they compute in bfloat16 on the CPU: without it
they compute in float32 (vLLM's `--dtype float32`, Muon's Newton-Schulz iterations in float32). A GPU is not
asked about. `$EAGLE3_CPU_BF16` (`0` or `1`) overrides the answer, for a benchmark of either path on one
machine.

**Cores.** The CPUs this process may run on (its affinity), capped by the cgroup's CPU quota (`cpu.max`
of cgroup v2, `cpu.cfs_quota_us` / `cpu.cfs_period_us` of v1), as a pod's `resources.limits.cpu` sets it:
a pod limited to 4 CPUs on a 64-core node gets 4, not 64.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

logger = logging.getLogger(__name__)

ENV_BF16 = "EAGLE3_CPU_BF16"
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
CPUINFO = Path("/proc/cpuinfo")
CGROUP_V2_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1_QUOTA = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
CGROUP_V1_PERIOD = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")


def cpu_flags(cpuinfo: str) -> set[str]:
    """The flags of the first processor in a /proc/cpuinfo text (every core of a machine has the same)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86; Arm names them Features
            return set(value.split())
    return set()


def native_bfloat16(env: dict[str, str] | None = None, cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes bfloat16 natively ($EAGLE3_CPU_BF16 overrides; unknown: False)."""
    env = dict(os.environ) if env is None else env
    forced = env.get(ENV_BF16, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    if cpuinfo is None:
        cpuinfo = _read(CPUINFO)
    flags = cpu_flags(cpuinfo or "")
    return bool(flags & {*BF16_FLAGS, "bf16"})  # Arm names it bf16


def quota_cpus(
    cpu_max: str | None = None, v1_quota: str | None = None, v1_period: str | None = None
) -> int | None:
    """CPUs the cgroup's quota allows (rounded up, at least 1); None without a quota. The texts default to
    this process's cgroup files."""
    if cpu_max is None and v1_quota is None:
        cpu_max = _read(CGROUP_V2_MAX)
        if cpu_max is None:
            v1_quota, v1_period = _read(CGROUP_V1_QUOTA), _read(CGROUP_V1_PERIOD)
    if cpu_max is not None:
        quota, _, period = cpu_max.strip().partition(" ")
        return _ratio(quota, period or "100000")
    if v1_quota is not None and v1_period is not None:
        return _ratio(v1_quota.strip(), v1_period.strip())
    return None


def _ratio(quota: str, period: str) -> int | None:
    if quota in ("max", "-1"):
        return None
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return max(1, math.ceil(q / p)) if q > 0 and p > 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def available_cpus() -> int:
    """The CPUs this process may use: its affinity, capped by its cgroup's quota."""
    affinity = len(os.sched_getaffinity(0))
    quota = quota_cpus()
    return min(affinity, quota) if quota is not None else affinity
