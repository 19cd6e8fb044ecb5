"""load_manifest: the API server's verdict on names, integers, quantities, numbers and duplicate keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3_contract.api.manifest import ManifestError, load_manifest
from tests.tiny_spec import minimal


def write(tmp_path: Path, spec: dict[str, Any] | None = None, name: Any = "run") -> Path:
    doc = {
        "apiVersion": "eagle3.dev/v1alpha1",
        "kind": "Eagle3Run",
        "metadata": {"name": name},
        "spec": spec if spec is not None else minimal(),
    }
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def error_of(path: Path) -> str:
    with pytest.raises(ManifestError) as caught:
        load_manifest(path)
    return str(caught.value)


# --- metadata.name: a DNS-1123 subdomain, as the API server requires of a custom resource's name ----------


@pytest.mark.parametrize(
    "name", ["../../escaped", "a/b", "MyRun", "my_run", "", "-run", "run-", "a..b", ".", "..", "a" * 254]
)
def test_names_the_api_server_rejects_are_rejected(tmp_path: Path, name: str) -> None:
    message = error_of(write(tmp_path, name=name))
    assert "metadata.name" in message and "DNS-1123 subdomain" in message
    assert "253" in message and "lowercase" in message


@pytest.mark.parametrize("name", [None, 5, ["a"]])
def test_a_missing_or_non_string_name_is_rejected(tmp_path: Path, name: Any) -> None:
    assert "metadata.name" in error_of(write(tmp_path, name=name))


@pytest.mark.parametrize("name", ["run", "a", "my-run.v2", "0day", "a" * 64, "a" * 253, "x." * 126 + "y"])
def test_names_the_api_server_accepts_are_accepted(tmp_path: Path, name: str) -> None:
    assert load_manifest(write(tmp_path, name=name)).name == name


# --- the same verdict as the API server on values (issue 13, item 11) -------------------------------------


def with_patch(dotted: str, value: Any) -> dict[str, Any]:
    spec = minimal()
    *parents, last = dotted.split(".")
    node = spec
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return spec


@pytest.mark.parametrize(
    "dotted",
    ["extraction.tokenBudget", "dataset.seed", "stages.train.activeDeadlineSeconds", "nodePool.tolerations"],
)
def test_integers_above_int64_are_rejected(tmp_path: Path, dotted: str) -> None:
    value: Any = 99999999999999999999999
    if dotted == "nodePool.tolerations":
        value, dotted = [{"tolerationSeconds": -(2**63) - 1}], "nodePool.tolerations[0].tolerationSeconds"
    message = error_of(write(tmp_path, with_patch(dotted.split("[")[0], value)))
    assert f"spec.{dotted}: " in message and "64-bit" in message
    assert "Input should be" not in message  # one problem per field: the server refuses it before the schema


def test_int64_bounds_are_accepted(tmp_path: Path) -> None:
    spec = with_patch("dataset.seed", 2**63 - 1)
    assert load_manifest(write(tmp_path, spec)).spec.dataset.seed == 2**63 - 1


@pytest.mark.parametrize("size", ["lots", "5 Gi", "5GB", "Gi", "1.2.3", "5gi", "0x10"])
def test_a_size_that_is_no_quantity_is_rejected(tmp_path: Path, size: str) -> None:
    message = error_of(write(tmp_path, with_patch("storage.artifacts.size", size)))
    assert "spec.storage.artifacts.size: " in message and "quantity" in message and repr(size) in message


def test_a_resource_that_is_no_quantity_is_rejected(tmp_path: Path) -> None:
    spec = with_patch("stages.train", {"resources": {"limits": {"memory": "plenty"}}})
    assert "spec.stages.train.resources.limits.memory: " in error_of(write(tmp_path, spec))


@pytest.mark.parametrize("size", ["500Gi", "1", "1.5T", "250M", "500m", "+1e3", "1E6", ".5Gi", "10", 10])
def test_quantities_are_accepted(tmp_path: Path, size: Any) -> None:
    spec = load_manifest(write(tmp_path, with_patch("storage.artifacts.size", size))).spec
    assert spec.storage.artifacts.size == size


@pytest.mark.parametrize("text", [".nan", ".inf", "-.inf"])
def test_a_number_that_is_not_finite_says_so(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, with_patch("training.learningRate", 0.5))
    path.write_text(path.read_text().replace("learningRate: 0.5", f"learningRate: {text}"))
    message = error_of(path)
    assert "spec.training.learningRate: " in message and "finite number" in message
    assert "<=" not in message and ">" not in message.split("learningRate: ")[1]


def test_duplicate_yaml_keys_are_rejected_with_the_key_and_line(tmp_path: Path) -> None:
    path = write(tmp_path)
    lines = path.read_text().splitlines()
    at = lines.index("spec:") + 1
    lines.insert(at, "  suspend: true")
    lines.insert(at, "  suspend: false")
    path.write_text("\n".join(lines) + "\n")
    message = error_of(path)
    assert "duplicate key 'suspend'" in message and f"line {at + 2}" in message


def test_duplicate_keys_in_nested_mappings_and_json_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(
        "apiVersion: eagle3.dev/v1alpha1\nkind: Eagle3Run\nmetadata:\n  name: a\n  name: b\nspec: {}\n"
    )
    assert "duplicate key 'name'" in error_of(path) and "line 5" in error_of(path)
    path = tmp_path / "m.json"
    path.write_text('{"apiVersion": "eagle3.dev/v1alpha1", "kind": "Eagle3Run", "kind": "Eagle3Run"}')
    assert "duplicate key 'kind'" in error_of(path)


# --- the verifier's config (issue 13) ----------------------------------------------------------------------


def test_verifier_config_problems() -> None:
    from eagle3_contract.api.rules import verifier_config_problems

    config = {"num_attention_heads": 32, "num_hidden_layers": 28}
    assert verifier_config_problems(config, tensor_parallel_size=8, layers=[2, 14, 27]) == []
    assert verifier_config_problems(config, tensor_parallel_size=8, layers=None) == []
    tp, layers = verifier_config_problems(config, tensor_parallel_size=3, layers=[2, 28])
    assert tp.startswith("spec.verifier.tensorParallelSize: 3 does not divide")
    assert "[1, 2, 4, 8, 16, 32]" in tp
    assert layers.startswith("spec.extraction.layers: ids [28] are beyond the verifier's 28 decoder layers")
    nested = {"model_type": "gemma3", "text_config": {"num_attention_heads": 8, "num_hidden_layers": 4}}
    assert len(verifier_config_problems(nested, tensor_parallel_size=3, layers=[4])) == 2
    assert verifier_config_problems({"model_type": "odd"}, tensor_parallel_size=3, layers=[99]) == []


# --- issue 28: what a manifest file may hold (items 11, 13, 15) -------------------------------------------


def document(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "eagle3.dev/v1alpha1",
        "kind": "Eagle3Run",
        "metadata": {"name": "run"},
        "spec": spec,
    }


def alias_bomb(levels: int) -> str:
    lines = ["apiVersion: eagle3.dev/v1alpha1", "kind: Eagle3Run", "metadata: {name: bomb}"]
    lines.append("x0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]")
    for i in range(1, levels):
        lines.append(f"x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    values = f"{{key: k, operator: In, values: *a{levels - 1}}}"
    terms = f"{{nodeSelectorTerms: [{{matchExpressions: [{values}, {values}]}}]}}"
    lines.append(
        "spec: {verifier: {model: m}, dataset: {source: d}, pod: {affinity: {nodeAffinity: "
        f"{{requiredDuringSchedulingIgnoredDuringExecution: {terms}}}}}}}}}"
    )
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_at_once_with_a_line(tmp_path: Path) -> None:
    """3 KB of nested anchors stood for 10**9 values, and the spec's validation spun on them for minutes."""
    import time

    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb(9))
    started = time.monotonic()
    with pytest.raises(ManifestError, match=r"bomb\.yaml: its aliases expand to more than 1,000,000 values"):
        load_manifest(path)
    assert time.monotonic() - started < 30  # a hang bound, not a speed target: it was minutes
    path.write_text(alias_bomb(1))  # a few aliases are YAML like any other
    terms = load_manifest(path).spec.pod.affinity["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert [e["values"] for e in terms["nodeSelectorTerms"][0]["matchExpressions"]] == [["lol"] * 10] * 2


def test_a_manifest_that_is_not_utf8_or_too_large_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_bytes(yaml.safe_dump(document(minimal())).encode().replace(b"verifier", b"v\xe9rifier"))
    with pytest.raises(
        ManifestError, match=r"run\.yaml: not UTF-8 text \(byte 0xe9 at offset \d+\); save it"
    ):
        load_manifest(path)
    path.write_text(yaml.safe_dump(document(minimal())) + "#" * (3 * 1024 * 1024))
    with pytest.raises(ManifestError, match=r"run\.yaml: 3,14\d,\d{3} bytes, more than the 3,145,728"):
        load_manifest(path)
    with pytest.raises(ManifestError, match=r"a directory"):
        load_manifest(tmp_path)
