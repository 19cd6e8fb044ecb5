"""Every manifest the chart renders validates with kubernetes-validate in strict mode (unknown fields are
errors) for Kubernetes 1.29 and the newest version kubernetes-validate knows, for every values file of
tests/chart/values/ (the private registry, one replica without the CRD, the usual extras...) and the defaults.

kubernetes-validate has schemas for Kubernetes' own kinds only (the CRD object included). The
prometheus-operator kinds (ServiceMonitor, PrometheusRule) have no schema here: their metadata is validated as
an ObjectMeta, their spec is not; test_chart_render checks the spec's content instead (the rules equal the
committed rules file, which promtool checks; the ServiceMonitor selects the metrics Service with honorLabels).
Known limits of the tool: it reports the first error of an object only, and does not check enums.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import referencing

from tests.chart.helm import SCENARIOS, only, template

kubernetes_validate = pytest.importorskip("kubernetes_validate")
from kubernetes_validate import utils as kv_utils  # noqa: E402  (after the importorskip)

OLDEST = "1.29.0"
NEWEST = kv_utils.latest_version()
VERSIONS = sorted({OLDEST, NEWEST})
# Custom resources without a schema in kubernetes-validate: only their metadata is validated.
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule"}
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


def validate(doc: dict[str, Any], version: str) -> None:
    """Strict validation; fails naming the object, the field and the Kubernetes version."""
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as err:
        where = ".".join(str(p) for p in err.path)
        pytest.fail(
            f"{doc['kind']}/{doc['metadata']['name']} is invalid for Kubernetes {version}: {where}: {err}"
        )


def validate_metadata(doc: dict[str, Any], version: str) -> None:
    """A custom resource's metadata against Kubernetes' strict ObjectMeta schema."""
    schema_dir = f"kubernetes-json-schema/v{version}-local-strict"
    definitions = kv_utils.schema_contents(f"{schema_dir}/_definitions.json", version)
    registry: referencing.Registry[Any] = (
        referencing.Resource.from_contents(definitions) @ referencing.Registry()
    )
    schema = {"$ref": f"{definitions['$id']}#/$defs/{OBJECT_META}"}
    jsonschema.Draft202012Validator(schema, registry=registry).validate(doc["metadata"])


def test_two_kubernetes_versions_are_checked() -> None:
    assert kv_utils.Version(NEWEST) > kv_utils.Version(OLDEST), (
        f"kubernetes-validate knows only up to {NEWEST}"
    )


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_rendered_manifest_validates_strictly(helm: Path, scenario: str, version: str) -> None:
    docs = template(helm, SCENARIOS[scenario], kube_version=version)
    validated, metadata_only = set(), set()
    for doc in docs:
        if doc["kind"] in CUSTOM_KINDS:
            validate_metadata(doc, version)
            metadata_only.add(doc["kind"])
        else:
            validate(doc, version)
            validated.add(doc["kind"])
    assert validated >= {"Deployment", "ServiceAccount", "ClusterRole", "Service"}
    if scenario != "single-replica":  # crds.install false: no CRD at all, kopf's peering CRDs included
        assert "CustomResourceDefinition" in validated
    assert {"ConfigMap"} <= validated
    if scenario in ("default", "extras", "private-registry"):
        assert "PodDisruptionBudget" in validated
    if scenario == "watch-namespaces":
        assert {"Role", "RoleBinding"} <= validated
    if scenario == "monitoring":
        assert metadata_only == CUSTOM_KINDS


def test_strict_validation_catches_an_unknown_field(helm: Path) -> None:
    """A control: the same validation rejects a Deployment with a misspelled container field."""
    deployment = copy.deepcopy(only(template(helm), "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, OLDEST, strict=True)
    monitor = only(template(helm, SCENARIOS["monitoring"]), "ServiceMonitor")
    monitor["metadata"]["lables"] = {}
    with pytest.raises(jsonschema.ValidationError):
        validate_metadata(monitor, OLDEST)
