"""Issue 29: a namespace user may use Eagle3Runs without RBAC of their own. The chart ships two ClusterRoles
that Kubernetes folds into the built-in roles (templates/aggregated-roles.yaml): RELEASE-edit into admin and
edit (every verb on eagle3runs, reading their status), RELEASE-view into view (reading both).

The rendered roles are checked with Helm alone; then, on the session's real API server (RBAC on, the
clusterrole-aggregation controller running), users bound to the built-in edit and view roles in one
namespace create, read and delete a run as the roles say, and nothing more, each call made as that user
(Impersonate-User).
"""

from __future__ import annotations

import os
import re
import time
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3_contract.api.base import API_VERSION, GROUP, KIND, PLURAL
from tests.chart.helm import CHART, NAMESPACE, aggregated, of_kind, operator_cluster_role, run, template
from tests.operator.apiserver import ServerAccess
from tests.operator.apiserver import _request as request
from tests.tiny_spec import tiny

Rendered = dict[str, list[dict[str, Any]]]

EDIT_VERBS = ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]
EDIT_RULES = [
    {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": EDIT_VERBS},
    {"apiGroups": [GROUP], "resources": [f"{PLURAL}/status"], "verbs": ["get"]},
]
VIEW_RULES = [
    {"apiGroups": [GROUP], "resources": [PLURAL, f"{PLURAL}/status"], "verbs": ["get", "list", "watch"]}
]
AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"


def user_roles(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The aggregated ClusterRoles: name -> role."""
    return {d["metadata"]["name"]: d for d in of_kind(docs, "ClusterRole") if aggregated(d)}


def aggregate_labels(role: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in role["metadata"]["labels"].items() if k.startswith(AGGREGATE)}


@pytest.mark.parametrize("scenario", ["default", "watch-namespaces", "extras"])
def test_edit_and_view_roles_fold_into_the_built_in_ones(rendered: Rendered, scenario: str) -> None:
    roles = user_roles(rendered[scenario])
    assert set(roles) == {"eagle3-operator-edit", "eagle3-operator-view"}
    edit, view = roles["eagle3-operator-edit"], roles["eagle3-operator-view"]
    assert aggregate_labels(edit) == {f"{AGGREGATE}edit": "true", f"{AGGREGATE}admin": "true"}
    assert aggregate_labels(view) == {f"{AGGREGATE}view": "true"}
    assert edit["rules"] == EDIT_RULES and view["rules"] == VIEW_RULES
    assert edit["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"


def test_the_roles_name_the_charts_own_crd(rendered: Rendered) -> None:
    """The group and plural the roles grant are those of the CRD the chart installs."""
    [crd] = [
        d for d in of_kind(rendered["default"], "CustomResourceDefinition") if d["spec"]["group"] == GROUP
    ]
    assert (crd["spec"]["group"], crd["spec"]["names"]["plural"]) == (GROUP, PLURAL)
    [version] = crd["spec"]["versions"]
    assert version["subresources"] == {"status": {}}, "the roles grant reading eagle3runs/status"


def test_aggregated_roles_can_be_left_out(helm: Path) -> None:
    docs = template(helm, sets=["rbac.aggregatedRoles=false"], include_crds=False)
    assert user_roles(docs) == {}
    assert operator_cluster_role(docs)["metadata"]["name"] == "eagle3-operator"


def readme_value_names() -> list[str]:
    """The values the chart README's table lists, `a.b`, `.c` shorthand expanded (`.c`: a sibling of a.b)."""
    readme = (CHART / "README.md").read_text()
    table = readme.split("## Values", 1)[1].split("\n## ", 1)[0]
    names: list[str] = []
    for line in table.splitlines():
        if not line.startswith("| `"):
            continue
        parent = ""
        for name in re.findall(r"`([^`]+)`", line.split("|")[1]):
            full = parent + name if name.startswith(".") else name
            parent = full.rsplit(".", 1)[0] if "." in full else ""
            names.append(full)
    return names


def test_the_readme_values_table_names_real_values() -> None:
    """Every value the chart README's table names is one the schema knows, rbac.aggregatedRoles among them."""
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    names = readme_value_names()
    assert len(names) >= 30, names
    assert "rbac.aggregatedRoles" in names and "crds.install" in names
    unknown = []
    for name in names:
        node = schema
        for part in name.split("."):
            node = (node.get("properties") or {}).get(part)
            if node is None:
                unknown.append(name)
                break
    assert not unknown, f"the README's values table names values the schema does not know: {unknown}"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["rbac"]["aggregatedRoles"] is True


# --- On the real API server -------------------------------------------------------------------------------

RBAC = "/apis/rbac.authorization.k8s.io/v1"
RELEASE = "e3-roles"  # names of its own: RELEASE-eagle3-operator-edit/-view
EDITOR, VIEWER = "eagle3-editor", "eagle3-viewer"
WAIT_S = 60.0  # a bound on the aggregation controller, not an expectation of its speed


class User:
    """API calls as `name`: the admin token, with Impersonate-User (what `kubectl --as NAME` sends)."""

    def __init__(self, access: ServerAccess, name: str) -> None:
        assert access.token is not None
        self.access, self.token, self.name = access, access.token, name

    def call(self, method: str, path: str, body: Any = None, content_type: str | None = None) -> Any:
        headers = {"Impersonate-User": self.name} | ({"Content-Type": content_type} if content_type else {})
        return request(f"{self.access.url}{path}", self.token, method, body, headers=headers)

    def status(self, method: str, path: str, body: Any = None, content_type: str | None = None) -> int:
        """The HTTP status of the call: 200/201 when allowed, 403 when RBAC forbids it."""
        try:
            self.call(method, path, body, content_type)
        except urllib.error.HTTPError as err:
            return err.code
        return 200 if method != "POST" else 201


def runs(namespace: str, name: str = "") -> str:
    return f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}" + (f"/{name}" if name else "")


def run_body(name: str) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": tiny()}


def grants_runs(role: dict[str, Any], verb: str) -> bool:
    return any(
        GROUP in r.get("apiGroups", []) and PLURAL in r.get("resources", []) and verb in r.get("verbs", [])
        for r in role.get("rules") or []
    )


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline, pause = time.monotonic() + WAIT_S, 0.05
    while not check():
        assert time.monotonic() < deadline, f"waited {WAIT_S}s for {what}"
        time.sleep(pause)
        pause = min(pause * 1.5, 0.5)


@pytest.fixture
def namespaces(server: ServerAccess) -> Iterator[tuple[str, str]]:
    """Two namespaces (the users' own, and another), deleted afterwards."""
    assert server.token is not None
    names = (f"e3-roles-{os.getpid()}-mine", f"e3-roles-{os.getpid()}-other")
    for name in names:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        request(f"{server.url}/api/v1/namespaces", server.token, "POST", body)
    yield names
    for name in names:
        request(f"{server.url}/api/v1/namespaces/{name}", server.token, "DELETE")


@pytest.mark.apiserver
def test_users_bound_to_edit_and_view_use_runs_through_the_charts_roles(
    helm: Path, server: ServerAccess, namespaces: tuple[str, str]
) -> None:
    assert server.token is not None
    admin = server.token
    mine, other = namespaces
    built_in = {name: request(f"{server.url}{RBAC}/clusterroles/{name}", admin) for name in ("edit", "view")}
    for name, role in built_in.items():  # the API server's bootstrap roles, built by aggregation
        assert role["aggregationRule"]["clusterRoleSelectors"], name
    for user, role in ((EDITOR, "edit"), (VIEWER, "view")):
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{user}-{role}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
        request(f"{server.url}{RBAC}/namespaces/{mine}/rolebindings", admin, "POST", binding)
    editor, viewer = User(server, EDITOR), User(server, VIEWER)
    if not grants_runs(built_in["edit"], "create"):  # (a cluster with the chart installed grants it already)
        assert editor.status("POST", runs(mine), run_body("before")) == 403, (
            "edit grants runs without the chart"
        )

    roles = user_roles(template(helm, release=RELEASE, include_crds=False))
    assert set(roles) == {f"{RELEASE}-eagle3-operator-edit", f"{RELEASE}-eagle3-operator-view"}
    try:
        for role in roles.values():
            request(f"{server.url}{RBAC}/clusterroles", admin, "POST", role)

        def folded() -> bool:
            got = {
                n: request(f"{server.url}{RBAC}/clusterroles/{n}", admin) for n in ("admin", "edit", "view")
            }
            return all(grants_runs(got[n], "delete") for n in ("admin", "edit")) and grants_runs(
                got["view"], "get"
            )

        wait_until(
            folded, "the clusterrole-aggregation controller to fold the chart's roles into admin/edit/view"
        )

        # edit, in its namespace: every verb on runs, their status
        created = editor.call("POST", runs(mine), run_body("mine"))
        assert created["metadata"]["namespace"] == mine
        assert editor.call("GET", f"{runs(mine, 'mine')}/status")["metadata"]["name"] == "mine"
        patch = {"metadata": {"labels": {"team": "a"}}}
        assert editor.status("PATCH", runs(mine, "mine"), patch, "application/merge-patch+json") == 200
        # ... and not in another namespace
        assert editor.status("POST", runs(other), run_body("theirs")) == 403
        assert editor.status("GET", runs(other)) == 403

        # view, in its namespace: read, never write
        assert [r["metadata"]["name"] for r in viewer.call("GET", runs(mine))["items"]] == ["mine"]
        assert viewer.call("GET", runs(mine, "mine"))["metadata"]["labels"]["team"] == "a"
        assert viewer.status("GET", f"{runs(mine, 'mine')}/status") == 200
        assert viewer.status("POST", runs(mine), run_body("viewers")) == 403
        assert viewer.status("PATCH", runs(mine, "mine"), patch, "application/merge-patch+json") == 403
        assert viewer.status("DELETE", runs(mine, "mine")) == 403
        assert viewer.status("GET", runs(other)) == 403

        assert editor.status("DELETE", runs(mine, "mine")) == 200
        wait_until(lambda: editor.status("GET", runs(mine, "mine")) == 404, "the run to be deleted")
    finally:
        for name in roles:
            request(f"{server.url}{RBAC}/clusterroles/{name}", admin, "DELETE")


def test_notes_say_who_may_use_runs(helm: Path) -> None:
    args = ["install", "eagle3-operator", str(CHART), "--dry-run=client", "--namespace", NAMESPACE]
    notes = run(helm, *args).stdout.split("NOTES:", 1)[1]
    assert "a user bound to the built-in edit (or admin) ClusterRole in a namespace may create" in notes
    assert "ClusterRoles eagle3-operator-edit and -view" in notes
    off = run(helm, *args, "--set", "rbac.aggregatedRoles=false").stdout.split("NOTES:", 1)[1]
    assert "Who may use runs" not in off
