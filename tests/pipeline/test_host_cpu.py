"""eagle3_pipeline.runtime.host_cpu: native bfloat16 from the CPU flags, the CPUs a cgroup quota allows."""

from __future__ import annotations

import os

from eagle3_pipeline.runtime.host_cpu import available_cpus, cpu_flags, native_bfloat16, quota_cpus

EPYC = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512_vnni\n"
SKYLAKE = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512bw avx512_vnni\n"
SAPPHIRE = "processor\t: 0\nflags\t\t: avx512f amx_tile amx_bf16 amx_int8\n"
GRAVITON = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


def test_native_bfloat16_follows_the_cpus_flags() -> None:
    assert cpu_flags(EPYC) >= {"avx512_bf16", "avx2"}
    assert native_bfloat16({}, EPYC) and native_bfloat16({}, SAPPHIRE) and native_bfloat16({}, GRAVITON)
    assert not native_bfloat16({}, SKYLAKE)  # AVX-512 without its bfloat16 extension: issue 30's machine
    assert not native_bfloat16({}, "")  # unknown: float32, which every CPU computes at full speed


def test_the_environment_overrides_the_flags_for_a_benchmark_of_either_path() -> None:
    assert not native_bfloat16({"EAGLE3_CPU_BF16": "0"}, EPYC)
    assert native_bfloat16({"EAGLE3_CPU_BF16": "1"}, SKYLAKE)
    assert native_bfloat16({"EAGLE3_CPU_BF16": "yes"}, EPYC)  # not 0 or 1: the flags decide


def test_a_cgroup_quota_caps_the_cpus() -> None:
    assert quota_cpus(cpu_max="max 100000\n") is None  # no limit
    assert quota_cpus(cpu_max="400000 100000\n") == 4  # a pod's limits.cpu: 4
    assert quota_cpus(cpu_max="150000 100000") == 2  # 1.5 CPUs: two threads, rounded up
    assert quota_cpus(cpu_max="50000 100000") == 1
    assert quota_cpus(v1_quota="-1", v1_period="100000") is None
    assert quota_cpus(v1_quota="200000\n", v1_period="100000\n") == 2
    assert 1 <= available_cpus() <= len(os.sched_getaffinity(0))
