"""docs/api.md: the committed reference is what the CRD renders; it shows every field, rule and column."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3_contract.api.crd import build_crd
from eagle3_contract.api.reference import (
    constraints,
    is_kubernetes_type,
    main,
    render_reference,
    slug,
    type_text,
)

ROOT = Path(__file__).resolve().parents[3]
COMMITTED = ROOT / "docs" / "api.md"
CRD_FILE = ROOT / "crds" / "eagle3runs.eagle3.dev.yaml"


def committed_crd() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CRD_FILE.read_text())
    return loaded


def open_api(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def section_text(doc: str, path: str) -> str:
    """The text under the heading of `path`, up to the next heading."""
    match = re.search(rf"^#+ `{re.escape(path)}`\n(.*?)(?=^#+ |\Z)", doc, re.S | re.M)
    assert match, f"no heading for {path} in the reference"
    return match.group(1)


def test_committed_reference_is_current() -> None:
    expected = render_reference(committed_crd())
    actual = COMMITTED.read_text() if COMMITTED.exists() else ""
    assert actual == expected, (
        "docs/api.md differs from the reference the CRD renders: regenerate it with `make crds` (or `python "
        "-m eagle3_contract.api.reference crds/eagle3runs.eagle3.dev.yaml > docs/api.md`) and commit it"
    )


def test_every_field_has_a_row_in_its_section_or_the_section_it_repeats() -> None:
    doc = render_reference(build_crd())

    def check(node: dict[str, Any], path: str) -> None:
        text = section_text(doc, path)
        same = re.search(r"Same fields as \[`([^`]+)`\]", text)
        if same:  # the same shape: its fields (and their objects) are under the first one's path
            path = same.group(1)
            text = section_text(doc, path)
        for name, sub in node.get("properties", {}).items():
            row = re.search(rf"^\| `{re.escape(name)}` \|.*$", text, re.M)
            assert row, f"{path}.{name} has no row in the reference"
            if "default" in sub:
                assert "`" in row.group(0).split(" | ")[2], f"{path}.{name}: its default is not shown"
            child = sub.get("items") if sub.get("type") == "array" else sub.get("additionalProperties")
            if is_kubernetes_type(sub):  # an embedded Kubernetes type: its row says so, no section of its own
                assert "Kubernetes schema" in row.group(0), f"{path}.{name}: not shown as a Kubernetes type"
            elif sub.get("properties"):
                check(sub, f"{path}.{name}")
            elif isinstance(child, dict) and child.get("properties"):
                check(child, f"{path}.{name}{'[]' if sub.get('type') == 'array' else '.<key>'}")

    schema = open_api(build_crd())
    check(schema["properties"]["spec"], "spec")
    check(schema["properties"]["status"], "status")


def test_every_cel_rule_and_printer_column_is_listed() -> None:
    crd = build_crd()
    doc = render_reference(crd)
    for rule in open_api(crd)["properties"]["spec"]["x-kubernetes-validations"]:
        assert rule["rule"].replace("|", "\\|") in doc, f"CEL rule {rule['rule']!r} missing"
        assert rule["message"] in doc
    for column in crd["spec"]["versions"][0]["additionalPrinterColumns"]:
        assert f"| {column['name']} | {column['type']} | `{column['jsonPath']}` |" in doc
    assert "| Phase | string | `.status.phase` | with `-o wide` |" in doc


def test_links_point_at_headings_that_exist() -> None:
    doc = render_reference(build_crd())
    anchors = {slug(line.lstrip("#")) for line in doc.splitlines() if line.startswith("#")}
    links = set(re.findall(r"\]\(#([^)]+)\)", doc))
    assert links, "the reference links no section"
    assert links <= anchors, f"links to missing headings: {sorted(links - anchors)}"


def test_repeated_objects_link_to_the_first_table_and_new_fields_appear() -> None:
    crd = build_crd()
    doc = render_reference(crd)
    assert "Same fields as [`spec.stages.predict`](#specstagespredict)." in section_text(
        doc, "spec.stages.verify"
    )
    assert "### `spec.stages.verify.resources`" not in doc  # inside a repeat: not shown twice
    changed = copy.deepcopy(crd)
    stages = open_api(changed)["properties"]["spec"]["properties"]["stages"]["properties"]
    stages["train"]["properties"]["extra"] = {"description": "A new knob.", "type": "integer", "minimum": 2}
    text = section_text(render_reference(changed), "spec.stages.train")
    assert "| `extra` | integer |  | >= 2 | A new knob. |" in text


def test_constraints_in_words() -> None:
    node = {
        "type": "number",
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": 1,
        "enum": [0.5, 1],
        "pattern": "^a|b$",
    }
    assert constraints(node) == ["> 0", "<= 1", "one of `0.5`, `1`", "pattern `^a\\|b$`"]
    quantities = {
        "type": "object",
        "additionalProperties": {"x-kubernetes-int-or-string": True, "pattern": "^q$"},
    }
    assert constraints(quantities) == ["each value: pattern `^q$`"]
    assert constraints(
        {"type": "array", "items": {"type": "string"}, "minItems": 1, "uniqueItems": True}
    ) == [
        "items >= 1",
        "items unique",
    ]


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ({"type": "string"}, "string"),
        ({"type": "string", "format": "date-time"}, "string (date-time)"),
        ({"x-kubernetes-int-or-string": True}, "integer or string"),
        ({"type": "array", "items": {"type": "string"}}, "array of string"),
        ({"type": "object", "additionalProperties": {"type": "string"}}, "map of string to string"),
        ({"type": "object", "x-kubernetes-preserve-unknown-fields": True}, "object (free-form)"),
    ],
)
def test_type_text(node: dict[str, Any], expected: str) -> None:
    assert type_text(node) == expected


def test_descriptions_stay_in_their_cell() -> None:
    crd = build_crd()
    spec = open_api(crd)["properties"]["spec"]
    spec["properties"]["suspend"]["description"] = "a | b\nc <think> `<code>`"
    row = next(line for line in render_reference(crd).splitlines() if line.startswith("| `suspend` |"))
    assert row.endswith("| a \\| b c &lt;think&gt; `<code>` |")


def test_main_reads_a_crd_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    crd = build_crd()
    crd["spec"]["names"]["kind"] = "Other"
    path = tmp_path / "crd.yaml"
    path.write_text(yaml.safe_dump(crd, sort_keys=False))
    assert main([str(path)]) == 0
    assert capsys.readouterr().out == render_reference(crd)
    assert main([]) == 0
    assert capsys.readouterr().out == render_reference(build_crd())
