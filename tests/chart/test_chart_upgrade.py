"""The CRD upgrade path, with the real Helm binary on a real API server: `helm install` creates the Eagle3Run
CRD from the chart's template, `helm upgrade` with a chart whose CRD changed changes it on the server (Helm
never upgrades crds/), `helm uninstall` leaves it and the runs with crds.keep (a reinstall adopts it), and
deletes it without.

One API server for this module (tests/operator/apiserver.py), started here rather than shared with
tests/operator: the chart owns the cluster-wide CRD, so the server's pre-installed one is deleted first. The
server is Kubernetes 1.20, so the chart under test is a copy with two changes: kubeVersion admits 1.20, and
the CRD is the one without CEL rules (1.20 rejects x-kubernetes-validations, as tests/operator installs it);
podDisruptionBudget is off (1.20 serves no policy/v1). No pod runs: the test server has no kubelet.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3_contract.api.base import API_VERSION, KIND, PLURAL
from eagle3_contract.api.crd import build_crd
from tests.chart.helm import CHART
from tests.operator.apiserver import ServerAccess, start_server, write_kubeconfig
from tests.operator.apiserver import _request as request
from tests.tiny_spec import tiny

pytestmark = pytest.mark.apiserver

RELEASE = "e3-upgrade"  # not the test server's own eagle3-operator ClusterRole
NAMESPACE = "eagle3-system"
RUNS_NAMESPACE = "team-a"
CRD_NAME = f"{PLURAL}.eagle3.dev"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MARKER = "upgradeMarker"  # the property the upgraded chart's CRD adds to spec


@pytest.fixture(scope="module")
def server() -> Iterator[ServerAccess]:
    if os.environ.get("EAGLE3_TEST_KUBECONFIG"):
        pytest.skip("installs and deletes the cluster-wide Eagle3Run CRD: only on a server started here")
    access = start_server()
    assert access.control is not None and access.token is not None
    request(f"{access.url}{CRDS}/{CRD_NAME}", access.token, "DELETE")
    wait_for(lambda: crd(access) is None, "the server's pre-installed CRD to go")
    request(f"{access.url}/api/v1/namespaces", access.token, "POST", namespace(RUNS_NAMESPACE))
    yield access
    access.control.stop_all()


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def crd(access: ServerAccess, name: str = CRD_NAME) -> dict[str, Any] | None:
    assert access.token is not None
    try:
        found: dict[str, Any] = request(f"{access.url}{CRDS}/{name}", access.token)
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return None
        raise
    return found


def wait_for(check: Any, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"waited {seconds}s for {what}"
        time.sleep(0.3)


def established(access: ServerAccess) -> bool:
    conditions = ((crd(access) or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def chart_copy(where: Path, version: str, marker: bool) -> Path:
    """The chart for a 1.20 server; `marker`: its CRD has an extra spec property (a changed CRD)."""
    chart = where / f"eagle3-operator-{version}"
    shutil.copytree(CHART, chart)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta |= {"version": version, "kubeVersion": ">=1.20.0-0"}
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    definition = build_crd(cel=False)
    if marker:
        schema = definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        schema["properties"][MARKER] = {"type": "string", "description": "added by the chart upgrade test"}
    (chart / "files" / "crds" / f"{CRD_NAME}.yaml").write_text(yaml.safe_dump(definition, sort_keys=False))
    return chart


class Helm:
    """The helm binary against the test server, its state in a temporary home."""

    def __init__(self, helm: Path, access: ServerAccess, home: Path) -> None:
        assert access.token is not None
        kubeconfig = write_kubeconfig(home / "kubeconfig", access.url, access.token)
        self.helm = helm
        self.env = os.environ | {
            "KUBECONFIG": str(kubeconfig),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def __call__(self, *args: str) -> str:
        result = subprocess.run(
            [str(self.helm), *args], capture_output=True, text=True, timeout=120, env=self.env
        )
        assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stderr}"
        return result.stdout

    def release(self, verb: str, chart: Path, *sets: str) -> str:
        """`helm install|upgrade` of the release with `sets` (the namespace is created on install)."""
        sets = ("podDisruptionBudget.enabled=false", *sets)
        args = [verb, RELEASE, str(chart), "--namespace", NAMESPACE, *(a for s in sets for a in ("--set", s))]
        return self(*args, *(["--create-namespace"] if verb == "install" else []))


def spec_properties(access: ServerAccess) -> dict[str, Any]:
    found = crd(access)
    assert found is not None, f"no CRD {CRD_NAME} on the server"
    properties: dict[str, Any] = found["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    return dict(properties["spec"]["properties"])


def create_run(access: ServerAccess, name: str) -> None:
    assert access.token is not None
    body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": tiny()}
    path = f"/apis/{API_VERSION}/namespaces/{RUNS_NAMESPACE}/{PLURAL}"
    request(f"{access.url}{path}", access.token, "POST", body)


def run_exists(access: ServerAccess, name: str) -> bool:
    assert access.token is not None
    path = f"/apis/{API_VERSION}/namespaces/{RUNS_NAMESPACE}/{PLURAL}/{name}"
    try:
        request(f"{access.url}{path}", access.token)
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return False
        raise
    return True


def test_helm_upgrade_upgrades_the_crd_and_uninstall_keeps_it(
    helm: Path, server: ServerAccess, tmp_path: Path
) -> None:
    run = Helm(helm, server, tmp_path)
    first, second = chart_copy(tmp_path, "0.1.0", marker=False), chart_copy(tmp_path, "0.1.1", marker=True)

    run.release("install", first)
    installed = crd(server)
    assert installed is not None and MARKER not in spec_properties(server)
    assert installed["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert installed["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    assert crd(server, "clusterkopfpeerings.kopf.dev") is not None, "the chart's crds/: kopf's peering CRDs"
    wait_for(lambda: established(server), "the CRD to be established")
    create_run(server, "kept")

    run.release("upgrade", second)
    assert spec_properties(server)[MARKER]["description"] == "added by the chart upgrade test"
    assert run_exists(server, "kept")

    run("uninstall", RELEASE, "--namespace", NAMESPACE)
    assert RELEASE not in run("list", "--namespace", NAMESPACE)
    assert MARKER in spec_properties(server), "crds.keep: helm uninstall leaves the CRD"
    assert run_exists(server, "kept"), "... and every run"

    run.release("install", second)  # the kept CRD carries this release's ownership: a reinstall adopts it
    run.release("upgrade", first, "crds.keep=false")
    assert MARKER not in spec_properties(server), "a downgrade applies the older CRD as well"
    assert "helm.sh/resource-policy" not in (crd(server) or {})["metadata"].get("annotations", {})
    run("uninstall", RELEASE, "--namespace", NAMESPACE)
    wait_for(lambda: crd(server) is None, "crds.keep false: helm uninstall deletes the CRD")
