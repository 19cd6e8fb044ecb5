"""Running the real Helm binary on charts/eagle3-operator and parsing what it renders.

Helm comes from scripts/install-helm.sh (`make helm`; `make test` runs it first): without it every test that
needs it skips, naming the command to run.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from tests import tiers

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "eagle3-operator"
VALUES = Path(__file__).parent / "values"
RELEASE = "eagle3-operator"
NAMESPACE = "eagle3-system"

# name -> the values files of a rendering scenario: the defaults, and each file of tests/chart/values/
SCENARIOS: dict[str, tuple[Path, ...]] = {
    "default": (),
    "watch-namespaces": (VALUES / "watch-namespaces.yaml",),
    "monitoring": (VALUES / "monitoring.yaml",),
    "private-registry": (VALUES / "private-registry.yaml",),
    "single-replica": (VALUES / "single-replica.yaml",),
    "extras": (VALUES / "extras.yaml",),
}


def helm_or_skip() -> Path:
    """The `helm` executable that scripts/install-helm.sh installed, or skip the test."""
    check = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install-helm.sh"), "--check"], capture_output=True, text=True
    )
    if check.returncode != 0:
        tiers.missing(
            "Helm",
            "helm is not installed: scripts/install-helm.sh --check says "
            f"{check.stderr.strip()!r} (run `make helm`; `make test` does)",
        )
    return Path(check.stdout.strip().splitlines()[-1]) / "helm"


def run(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


def values_args(files: Sequence[Path] = (), sets: Sequence[str] = ()) -> list[str]:
    return [*(a for f in files for a in ("--values", str(f))), *(a for s in sets for a in ("--set", s))]


def template(
    helm: Path,
    files: Sequence[Path] = (),
    sets: Sequence[str] = (),
    kube_version: str | None = None,
    include_crds: bool = True,
    release: str = RELEASE,
) -> list[dict[str, Any]]:
    """`helm template` of the chart as release `release` in eagle3-system: the rendered objects."""
    args = ["template", release, str(CHART), "--namespace", NAMESPACE, *values_args(files, sets)]
    args += ["--include-crds"] if include_crds else []
    args += ["--kube-version", kube_version] if kube_version else []
    result = run(helm, *args)
    assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def template_error(helm: Path, sets: Sequence[str]) -> str:
    """`helm template` with values that must be refused: Helm's error message."""
    result = run(helm, "template", RELEASE, str(CHART), *values_args(sets=sets))
    assert result.returncode != 0, f"helm template accepted {sets}:\n{result.stdout[:2000]}"
    return result.stderr


def operator_container(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The operator container of the one Deployment."""
    pod = only(docs, "Deployment")["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["operator"]
    return dict(pod["containers"][0])


AGGREGATE_LABEL = "rbac.authorization.k8s.io/aggregate-to-"  # ...edit, ...view, ...admin


def aggregated(role: dict[str, Any]) -> bool:
    """Whether a ClusterRole is one Kubernetes folds into the built-in admin/edit/view roles."""
    return any(key.startswith(AGGREGATE_LABEL) for key in role["metadata"].get("labels") or {})


def operator_cluster_role(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The operator's own ClusterRole (not the users' aggregated ones, templates/aggregated-roles.yaml)."""
    found = [d for d in of_kind(docs, "ClusterRole") if not aggregated(d)]
    assert len(found) == 1, (
        f"expected one operator ClusterRole, rendered {[d['metadata']['name'] for d in found]}"
    )
    return found[0]


def only(docs: Sequence[dict[str, Any]], kind: str, namespace: str | None = None) -> dict[str, Any]:
    """The one object of `kind` (in `namespace` if given)."""
    found = of_kind(docs, kind, namespace)
    assert len(found) == 1, f"expected one {kind}, rendered {[d['metadata']['name'] for d in found]}"
    return found[0]


def of_kind(docs: Sequence[dict[str, Any]], kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
    return [
        d
        for d in docs
        if d["kind"] == kind and (namespace is None or d["metadata"].get("namespace") == namespace)
    ]
