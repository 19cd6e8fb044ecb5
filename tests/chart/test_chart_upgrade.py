"""The CRD upgrade path, with the real Helm binary on a real API server: `helm install` creates the
Eagle3Run CRD and kopf's peering CRDs from the chart's templates, `helm upgrade` with a chart whose CRD
changed changes it on the server (Helm never upgrades a chart's crds/), `helm uninstall` leaves them and the
runs with crds.keep (a reinstall adopts them), and deletes them without. A release of the earlier chart, whose
peering CRDs came from its crds/, upgrades with --take-ownership; a second release in the cluster installs
with crds.install=false.

One API server for this module (tests/operator/apiserver.py), started here rather than shared with
tests/operator: the chart owns the cluster-wide CRDs, so the server's pre-installed ones are deleted before
each test. The server is Kubernetes 1.20: the chart renders its CRD without CEL rules there
(files/crds-no-cel/) and a policy/v1beta1 PodDisruptionBudget; the chart under test is a copy whose version
and (with `marker`) CRD differ. No pod runs: the test server has no kubelet (tests/cluster installs the chart
on a real node).
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
PEERING_CRDS = ("clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev")
ALL_CRDS = (CRD_NAME, *PEERING_CRDS)
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MARKER = "upgradeMarker"  # the property the upgraded chart's CRD adds to spec


@pytest.fixture(scope="module")
def server() -> Iterator[ServerAccess]:
    if os.environ.get("EAGLE3_TEST_KUBECONFIG"):
        pytest.skip("installs and deletes the cluster-wide Eagle3Run CRD: only on a server started here")
    access = start_server()
    assert access.control is not None and access.token is not None
    request(f"{access.url}/api/v1/namespaces", access.token, "POST", namespace(RUNS_NAMESPACE))
    yield access
    access.control.stop_all()


@pytest.fixture
def no_crds(server: ServerAccess) -> ServerAccess:
    """The server without the three CRDs the chart templates (the server's pre-installed ones, or those an
    earlier test's release kept)."""
    assert server.token is not None
    for name in ALL_CRDS:
        if crd(server, name) is not None:
            request(f"{server.url}{CRDS}/{name}", server.token, "DELETE")
    wait_for(lambda: all(crd(server, name) is None for name in ALL_CRDS), "the CRDs to go")
    return server


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


def chart_copy(where: Path, version: str, marker: bool, earlier: bool = False) -> Path:
    """The chart for a 1.20 server; `marker`: its CRD has an extra spec property (a changed CRD);
    `earlier`: the layout of the chart before the peering CRDs were templates (in its crds/, which Helm
    installs once)."""
    chart = where / f"eagle3-operator-{version}"
    shutil.copytree(CHART, chart)
    if earlier:
        (chart / "crds").mkdir()
        (chart / "files" / "crds" / "kopf-peering.yaml").rename(chart / "crds" / "kopf-peering.yaml")
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta |= {"version": version}
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    if marker:  # in the CRD a 1.20 server gets: the one without CEL rules
        definition = build_crd(cel=False)
        schema = definition["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        schema["properties"][MARKER] = {"type": "string", "description": "added by the chart upgrade test"}
        path = chart / "files" / "crds-no-cel" / f"{CRD_NAME}.yaml"
        path.write_text(yaml.safe_dump(definition, sort_keys=False))
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
        result = self.attempt(*args)
        assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stderr}"
        return result.stdout

    def attempt(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.helm), *args], capture_output=True, text=True, timeout=120, env=self.env
        )

    def release(
        self, verb: str, chart: Path, *sets: str, release: str = RELEASE, namespace: str = NAMESPACE
    ) -> list[str]:
        """The arguments of `helm install|upgrade` of `release` with `sets` (its namespace created on
        install)."""
        args = [verb, release, str(chart), "--namespace", namespace, *(a for s in sets for a in ("--set", s))]
        return [*args, *(["--create-namespace"] if verb == "install" else [])]

    def install(self, chart: Path, *sets: str, **where: str) -> str:
        return self(*self.release("install", chart, *sets, **where))

    def upgrade(self, chart: Path, *sets: str, **where: str) -> str:
        return self(*self.release("upgrade", chart, *sets, **where))


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


def crd_annotations(access: ServerAccess, name: str) -> dict[str, str]:
    found = crd(access, name)
    assert found is not None, f"no CRD {name} on the server"
    return dict(found["metadata"].get("annotations") or {})


def owner(access: ServerAccess, name: str) -> tuple[str | None, str | None]:
    """The release (name, namespace) Helm's annotations on CRD `name` say owns it."""
    found = crd_annotations(access, name)
    return found.get("meta.helm.sh/release-name"), found.get("meta.helm.sh/release-namespace")


def test_helm_upgrade_upgrades_the_crd_and_uninstall_keeps_it(
    helm: Path, no_crds: ServerAccess, tmp_path: Path
) -> None:
    server, run = no_crds, Helm(helm, no_crds, tmp_path)
    first, second = chart_copy(tmp_path, "0.1.0", marker=False), chart_copy(tmp_path, "0.1.1", marker=True)

    run.install(first)
    assert MARKER not in spec_properties(server)
    for name in ALL_CRDS:  # kopf's peering CRDs are templates too: owned by the release, kept
        assert crd_annotations(server, name)["helm.sh/resource-policy"] == "keep", name
        assert owner(server, name) == (RELEASE, NAMESPACE), name
    wait_for(lambda: established(server), "the CRD to be established")
    create_run(server, "kept")

    run.upgrade(second)
    assert spec_properties(server)[MARKER]["description"] == "added by the chart upgrade test"
    assert run_exists(server, "kept")

    run("uninstall", RELEASE, "--namespace", NAMESPACE)
    assert RELEASE not in run("list", "--namespace", NAMESPACE)
    assert MARKER in spec_properties(server), "crds.keep: helm uninstall leaves the CRD"
    assert all(crd(server, name) is not None for name in PEERING_CRDS), "... and the peering CRDs"
    assert run_exists(server, "kept"), "... and every run"

    run.install(second)  # the kept CRDs carry this release's ownership: a reinstall adopts them
    run.upgrade(first, "crds.keep=false")
    assert MARKER not in spec_properties(server), "a downgrade applies the older CRD as well"
    for name in ALL_CRDS:
        assert "helm.sh/resource-policy" not in crd_annotations(server, name), name
    run("uninstall", RELEASE, "--namespace", NAMESPACE)
    wait_for(
        lambda: all(crd(server, name) is None for name in ALL_CRDS),
        "crds.keep false: helm uninstall deletes the CRDs, kopf's peering CRDs included",
    )


def test_a_release_of_the_earlier_chart_takes_over_its_peering_crds(
    helm: Path, no_crds: ServerAccess, tmp_path: Path
) -> None:
    """The earlier chart installed kopf's peering CRDs from its crds/, without Helm's ownership: upgrading
    to this chart (where they are templates) is refused, naming them, until --take-ownership
    (docs/install.md)."""
    server, run = no_crds, Helm(helm, no_crds, tmp_path)
    earlier, current = (
        chart_copy(tmp_path, "0.1.0", False, earlier=True),
        chart_copy(tmp_path, "0.1.1", False),
    )
    run.install(earlier)
    assert owner(server, "clusterkopfpeerings.kopf.dev") == (None, None), "crds/: installed, never owned"

    refused = run.attempt(*run.release("upgrade", current))
    assert refused.returncode != 0, "an upgrade adopted CRDs no release owned"
    assert "kopf.dev" in refused.stderr and "invalid ownership metadata" in refused.stderr, refused.stderr
    run(*run.release("upgrade", current), "--take-ownership")
    for name in PEERING_CRDS:
        assert owner(server, name) == (RELEASE, NAMESPACE), name
        assert crd_annotations(server, name)["helm.sh/resource-policy"] == "keep", name
    run("uninstall", RELEASE, "--namespace", NAMESPACE)


def test_a_second_release_leaves_the_crds_to_the_first(
    helm: Path, no_crds: ServerAccess, tmp_path: Path
) -> None:
    """CRDs are cluster-wide and the first release owns them: a second release with the defaults is refused
    before it creates anything, and installs with crds.install=false (the chart README, docs/install.md)."""
    server, run = no_crds, Helm(helm, no_crds, tmp_path)
    chart = chart_copy(tmp_path, "0.1.0", marker=False)
    run.install(chart)
    second = {"release": "e3-second", "namespace": "eagle3-second"}

    refused = run.attempt(*run.release("install", chart, **second))
    assert refused.returncode != 0, "a second release took over the first one's CRDs"
    assert CRD_NAME in refused.stderr and "invalid ownership metadata" in refused.stderr, refused.stderr
    listed = run("list", "--namespace", "eagle3-second")  # releases of every status, failed ones included
    assert "e3-second" not in listed, "the refused install left a release behind"

    run.install(chart, "crds.install=false", f"watchNamespaces={{{RUNS_NAMESPACE}}}", **second)
    for name in ALL_CRDS:
        assert owner(server, name) == (RELEASE, NAMESPACE), name
    assert token_request(
        server, "/apis/rbac.authorization.k8s.io/v1/clusterroles/e3-second-eagle3-operator-edit"
    )
    run("uninstall", "e3-second", "--namespace", "eagle3-second")
    assert all(crd(server, name) is not None for name in ALL_CRDS), "the first release's CRDs stay"
    run("uninstall", RELEASE, "--namespace", NAMESPACE)


def token_request(access: ServerAccess, path: str) -> Any:
    assert access.token is not None
    return request(f"{access.url}{path}", access.token)
