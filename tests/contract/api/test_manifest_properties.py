"""The local validator (load_manifest) and the API server (the CRD's schema, its CEL rules, the name and
integer rules of the server itself) accept and reject the same manifests.

Manifests are generated valid, then maybe broken in one place: a field of the wrong type or out of range, an
unknown key, an integer past int64, a size that is no quantity, a name the server refuses. The server is
modelled offline: metadata.name as a DNS-1123 subdomain, integers decoded as int64, unknown fields refused
(kubectl's strict field validation), the schema by jsonschema, the rules by cel-python on the defaulted spec.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagle3_contract.api.manifest import ManifestError, load_manifest
from eagle3_contract.api.rules import RULES
from tests.contract.api.api_support import (
    PRESERVE,
    cel_holds,
    crd_validator,
    defaulted,
    set_path,
    spec_schema,
    valid_specs,
    walk_values,
)
from tests.contract.api.test_spec_validation import field_mutations
from tests.tiny_spec import minimal

FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
WORK = Path(tempfile.mkdtemp(prefix="eagle3-manifest-properties-"))

# --- the API server, offline --------------------------------------------------------------------------------

SERVER_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _ints_fit(value: Any) -> bool:
    if isinstance(value, dict):
        return all(_ints_fit(v) for v in value.values())
    if isinstance(value, list):
        return all(_ints_fit(v) for v in value)
    return isinstance(value, bool) or not isinstance(value, int) or -(2**63) <= value < 2**63


def _no_unknown_fields(schema: dict[str, Any], value: Any) -> bool:
    if schema.get(PRESERVE):
        return True
    if isinstance(value, dict) and "properties" in schema:
        props = schema["properties"]
        return all(k in props and _no_unknown_fields(props[k], v) for k, v in value.items())
    if isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        return all(_no_unknown_fields(schema["additionalProperties"], v) for v in value.values())
    if isinstance(value, list) and "items" in schema:
        return all(_no_unknown_fields(schema["items"], v) for v in value)
    return True


def server_accepts(name: Any, spec: dict[str, Any]) -> bool:
    if not (isinstance(name, str) and len(name) <= 253 and SERVER_NAME.fullmatch(name)):
        return False
    if not _ints_fit(spec) or not _no_unknown_fields(spec_schema(), spec):
        return False
    if next(crd_validator(spec_schema()).iter_errors(spec), None) is not None:
        return False
    stored = defaulted(spec)
    return all(cel_holds(rule.rule, stored) for rule in RULES)


def local_accepts(name: Any, spec: dict[str, Any]) -> bool:
    doc = {"apiVersion": "eagle3.dev/v1alpha1", "kind": "Eagle3Run", "metadata": {"name": name}, "spec": spec}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=WORK, delete=False) as handle:
        yaml.safe_dump(doc, handle, sort_keys=False)
    try:
        load_manifest(handle.name)
    except ManifestError:
        return False
    finally:
        Path(handle.name).unlink()
    return True


# --- manifests ----------------------------------------------------------------------------------------------

GOOD_NAMES = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,20}[a-z0-9])?", fullmatch=True) | st.sampled_from(
    ["a" * 253, "x." * 126 + "y", "run-1.v2"]
)
BAD_NAMES = st.sampled_from(["../../escaped", "a/b", "MyRun", "my_run", "", "-a", "a-", "a..b", "a" * 254])
NOT_QUANTITIES = st.sampled_from(["lots", "5 Gi", "5GB", "Gi", "1.2.3", "0x10"]) | st.text(
    alphabet="abcxyz _/", min_size=1, max_size=6
)
HUGE = st.integers(2**63, 2**80) | st.integers(-(2**80), -(2**63) - 1)


@st.composite
def value_breaks(draw: st.DrawFn) -> dict[str, Any]:
    """A valid spec with one integer past int64, or one quantity that is none."""
    doc = defaulted(draw(valid_specs()))
    values = list(walk_values(spec_schema(), doc))
    ints = [path for path, schema in values if schema.get("type") == "integer"]
    quantities = [path for path, schema in values if schema.get("x-kubernetes-int-or-string")]
    if quantities and draw(st.booleans()):
        set_path(doc, draw(st.sampled_from(quantities)), draw(NOT_QUANTITIES))
    else:
        set_path(doc, draw(st.sampled_from(ints)), draw(HUGE))
    return doc


MANIFESTS = st.one_of(
    st.tuples(GOOD_NAMES, valid_specs()),
    st.tuples(BAD_NAMES, valid_specs()),
    st.tuples(GOOD_NAMES, field_mutations().map(lambda case: case[0])),
    st.tuples(GOOD_NAMES, value_breaks()),
)


@FAST
@given(MANIFESTS)
def test_local_and_cluster_validation_agree(case: tuple[Any, dict[str, Any]]) -> None:
    name, spec = case
    assert local_accepts(name, spec) == server_accepts(name, spec), (name, spec)


def test_the_model_of_the_server_rejects_what_the_issue_names() -> None:
    """The offline server is no straw man: the cases of issue 13 are refused by it, and locally."""
    spec = defaulted(minimal())
    assert server_accepts("run", spec) and local_accepts("run", spec)
    for name in ("../../escaped", "a/b", "MyRun", "my_run"):
        assert not server_accepts(name, spec) and not local_accepts(name, spec)
    for path, value in ((("extraction", "tokenBudget"), 10**23), (("storage", "artifacts", "size"), "lots")):
        broken = defaulted(spec)
        set_path(broken, path, value)
        assert not server_accepts("run", broken) and not local_accepts("run", broken)
