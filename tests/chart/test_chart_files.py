"""The chart's copies (CRD, dashboard, rules) and its RBAC file are current (`make chart`); its values file
satisfies its own schema. No Helm needed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from devtools import chart

from eagle3_operator import rbac
from tests.chart.helm import CHART, ROOT


def canonical(rules: list[dict[str, Any]] | tuple[dict[str, Any], ...]) -> list[str]:
    """Rules as sorted JSON strings: RBAC rules are a set, their order means nothing."""
    return sorted(json.dumps(r, sort_keys=True) for r in rules)


def test_chart_copies_are_current() -> None:
    stale = chart.GENERATOR.stale()
    assert not stale, (
        f"{', '.join(stale)} differ(s) from the file(s) the chart copies or from eagle3_operator/rbac.py: "
        f"run `{chart.MAKE_TARGET}` and commit the result"
    )


def test_crd_copies_equal_crds() -> None:
    """Every CRD of crds/ (the Eagle3Run CRD and kopf's peering CRDs) where templates/crds.yaml reads it, and
    nothing in a crds/ directory of the chart (which Helm would never upgrade)."""
    sources = sorted((ROOT / "crds").iterdir())
    assert [p.name for p in sources] == ["eagle3runs.eagle3.dev.yaml", "kopf-peering.yaml"]
    for source in sources:
        copy = CHART / "files" / "crds" / source.name
        assert copy.read_bytes() == source.read_bytes(), (
            f"{copy.relative_to(ROOT)} differs from {source.relative_to(ROOT)}: run `{chart.MAKE_TARGET}`"
        )
    assert sorted(p.name for p in (CHART / "files" / "crds").iterdir()) == [p.name for p in sources]
    assert not (CHART / "crds").exists(), "the chart's CRDs are templates (templates/crds.yaml)"


def test_rbac_file_is_rbac_rules_split_by_scope() -> None:
    split = yaml.safe_load((ROOT / chart.RBAC_PATH).read_text())
    assert set(split) == {"namespaced", "clusterScoped"}
    assert canonical(split["namespaced"] + split["clusterScoped"]) == canonical(rbac.RULES)
    cluster_scoped = (["customresourcedefinitions"], ["namespaces"], ["clusterkopfpeerings"])
    assert canonical(split["clusterScoped"]) == canonical(
        [r for r in rbac.RULES if r["resources"] in cluster_scoped]
    )


def test_a_rule_mixing_scopes_is_refused() -> None:
    rule = {"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["get"]}
    with pytest.raises(ValueError, match="mixes cluster-scoped and namespaced resources"):
        chart.split_rules([rule])


def test_write_and_check_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for source in chart.COPIES.values():
        (tmp_path / source).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / source, tmp_path / source)
    assert chart.GENERATOR.main(["--check", "--root", str(tmp_path)]) == 1
    assert chart.GENERATOR.main(["--root", str(tmp_path)]) == 0
    assert chart.GENERATOR.main(["--check", "--root", str(tmp_path)]) == 0
    dashboard = tmp_path / chart.CHART_DIR / "files" / "eagle3-dashboard.json"
    dashboard.write_text("{}\n")
    capsys.readouterr()
    assert chart.GENERATOR.main(["--check", "--root", str(tmp_path)]) == 1
    assert "eagle3-dashboard.json differs from its source: run `make chart`" in capsys.readouterr().err


def load_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return schema


def test_values_file_satisfies_the_schema() -> None:
    schema = load_schema()
    jsonschema.Draft7Validator.check_schema(schema)
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.Draft7Validator(schema).validate(values)
    assert set(values) <= set(schema["properties"]), "every value the chart defines has a schema"


def closed_objects(schema: dict[str, Any], path: str = "") -> dict[str, bool]:
    """path -> whether an object schema with `properties` refuses unknown keys."""
    found: dict[str, bool] = {}
    if "properties" in schema:
        found[path or "/"] = schema.get("additionalProperties") is False
        for key, sub in schema["properties"].items():
            found |= closed_objects(sub, f"{path}/{key}")
    if isinstance(schema.get("items"), dict):
        found |= closed_objects(schema["items"], f"{path}/*")
    return found


# Open on purpose: the top level (a parent chart's or a tool's keys), Helm's globals, and Kubernetes objects
# passed through to the pod (only the fields the chart relies on are typed).
OPEN = {
    "/",
    "/global",
    "/podSecurityContext",
    "/securityContext",
    "/securityContext/capabilities",
    "/securityContext/seccompProfile",
    "/topologySpreadConstraints/*",
    "/extraEnv/*",
}


def test_the_charts_own_objects_refuse_unknown_keys() -> None:
    """A misspelled key of an object the chart defines (image.tga) fails; only the OPEN ones take extras."""
    objects = closed_objects(load_schema())
    assert {path for path, closed in objects.items() if not closed} == OPEN
    assert load_schema()["additionalProperties"] is True
