"""`make demo` as a test: the tiny example from manifest to a serving Deployment, and bad manifests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.demo import demo, load_manifest

pytestmark = pytest.mark.operator
ROOT = Path(__file__).resolve().parents[2]


async def test_the_demo_takes_the_tiny_example_to_serving(capsys):
    assert await demo(ROOT / "examples" / "tiny" / "eagle3run.yaml") == 0
    out = capsys.readouterr().out
    assert "- generate: the operator created" in out, "the tiny run regenerates its answers"
    assert "--speculative-config" in out
    assert out.strip().endswith("Eagle3Run tiny: Serving")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: Deployment\n", "expected exactly one document of kind Eagle3Run"),
        (
            "apiVersion: eagle3.dev/v1alpha1\nkind: Eagle3Run\nspec: {}\n",
            "metadata.name is missing; it must be a DNS-1123 subdomain",
        ),
        (
            "apiVersion: eagle3.dev/v1alpha1\nkind: Eagle3Run\nmetadata: {name: x}\n"
            "spec: {verifier: {model: m}}\n",
            "spec.dataset: Field required",
        ),
        ("kind: [\n", "not valid YAML"),
    ],
)
def test_bad_manifests_are_refused_with_the_reason(tmp_path, text, message):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit, match=message):
        load_manifest(path)
