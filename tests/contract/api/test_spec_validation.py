"""parse_spec: valid specs parse; a spec broken in one place fails with InvalidSpecError naming that place.

Mutations are derived from the CRD's structural schema (itself generated from the models), so every field is
covered: a value out of range, of the wrong type or outside its enum/pattern, an unknown key, or a broken
cross-field rule. Whatever the input, nothing but InvalidSpecError escapes.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from eagle3_contract.api import InvalidSpecError, parse_spec, spec_document
from eagle3_contract.api.fields import duration_seconds
from eagle3_contract.api.rules import RULES, CrossFieldRule
from eagle3_contract.api.validation import INT64_MAX, INT64_MIN
from tests.contract.api.api_support import (
    INT_OR_STRING,
    PRESERVE,
    Path,
    cel_holds,
    crd_validator,
    defaulted,
    from_schema,
    get_path,
    problem_path,
    set_path,
    spec_schema,
    valid_specs,
    walk_values,
)
from tests.tiny_spec import minimal

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Values of another JSON type that neither pydantic (even in lax mode) nor the API server accepts.
WRONG_TYPES: dict[str, list[Any]] = {
    "integer": ["many", [1], {"a": 1}, 1.5],
    "number": ["much", [1.0], {"a": 1}],
    "string": [5, True, ["a"], {"a": "b"}],
    "boolean": ["maybe", 2, [True], {"a": True}],
    "array": ["a", 3, {"a": 1}],
    "object": ["a", 3, [1]],
    INT_OR_STRING: [[1], {"a": "1"}, 1.5],
}
NOT_MATCHING = ["Not Valid!", "-", "x" * 70, "UPPER"]
UNKNOWN_KEYS = ["unknownField", "Verifier", "gpusPerNodes", "x", "enabled"]


def wrong_types(schema: dict[str, Any]) -> list[Any]:
    return WRONG_TYPES[INT_OR_STRING if schema.get(INT_OR_STRING) else schema["type"]]


def out_of_range(schema: dict[str, Any]) -> list[Any]:
    """Values of the right type that break one of the node's own constraints."""
    bad: list[Any] = []
    step = 1 if schema.get("type") == "integer" else 0.5
    if "enum" in schema:
        bad.append(f"not-{schema['enum'][0]}")
    if "minimum" in schema:
        bad.append(schema["minimum"] if schema.get("exclusiveMinimum") else schema["minimum"] - step)
    if "maximum" in schema:
        bad.append(schema["maximum"] if schema.get("exclusiveMaximum") else schema["maximum"] + step)
    if schema.get("minLength", 0) > 0:
        bad.append("")
    if "maxLength" in schema:
        bad.append("a" * (schema["maxLength"] + 1))
    if "pattern" in schema:
        bad += [s for s in NOT_MATCHING if not re.search(schema["pattern"], s)][:1]
    if schema.get("minItems", 0) > 0:
        bad.append([])
    return bad


@st.composite
def field_mutations(draw: st.DrawFn) -> tuple[dict[str, Any], str, str]:
    """(spec, the problem path it must be reported at, what was done)."""
    doc = defaulted(draw(valid_specs()))
    path, schema = draw(st.sampled_from(list(walk_values(spec_schema(), doc))))
    choices: dict[str, list[tuple[Path, Any]]] = {
        "wrong type": [(path, v) for v in wrong_types(schema)],
        "out of range": [(path, v) for v in out_of_range(schema)],
    }
    if "maxItems" in schema:
        too_many = draw(st.lists(from_schema(schema["items"]), min_size=schema["maxItems"] + 1))
        choices["too many items"] = [(path, too_many)]
    if "properties" in schema:
        # camelCase only: populate_by_name makes pydantic accept snake_case field names too
        key = draw(st.sampled_from(UNKNOWN_KEYS).filter(lambda k: k not in schema["properties"]))
        choices["unknown key"] = [((*path, key), 1)]
    what = draw(st.sampled_from(sorted(k for k, v in choices.items() if v)))
    target, value = draw(st.sampled_from(choices[what]))
    set_path(doc, target, value)
    return doc, problem_path(target), f"{what}: {value!r}"


@st.composite
def root_unknown_keys(draw: st.DrawFn) -> tuple[dict[str, Any], str]:
    doc = draw(valid_specs())
    key = draw(
        st.from_regex(r"[a-zA-Z]{1,12}", fullmatch=True).filter(
            lambda k: k not in spec_schema()["properties"]
        )
    )
    # integers a JSON decoder stores: one beyond int64 is refused while decoding, before the unknown key
    # (the API server's order too; test_an_integer_beyond_int64_is_refused_before_the_schema_check)
    value = draw(st.integers(INT64_MIN, INT64_MAX) | st.text(max_size=3) | st.just({}))
    return {**doc, key: value}, f"spec.{key}"


def _break(rule: CrossFieldRule, doc: dict[str, Any], draw: st.DrawFn) -> None:
    """Break `rule` (only) by changing the field the rule is reported at."""
    eff = defaulted(doc)
    per_node, max_len = eff["nodePool"]["gpusPerNode"], eff["dataset"]["maxSequenceLength"]
    if rule.field_path in (".training.gpus", ".verifier.tensorParallelSize"):
        assume(per_node < 64)
        doc.setdefault("nodePool", {})["device"] = "gpu"  # the GPUs of a node bound GPU runs only
        value: Any = draw(st.integers(per_node + 1, 64))
    elif rule.field_path == ".extraction.layers":
        layers = eff["extraction"].get("layers", [draw(st.integers(0, 80))])
        value = [*layers[:15], layers[0]]
    elif rule.field_path == ".verifier.maxModelLen":
        assume(max_len > 128)
        value = draw(st.integers(128, max_len - 1))
    elif rule.field_path == ".draft.candidates":
        # a method twice, the methods trained the same (their own rules hold as before); a prediction
        # refuses any candidates (its own rule), so there is none
        listed = doc.get("draft", {}).get("candidates") or [eff["draft"]["method"]]
        assume(len(listed) < 3)  # at most 3 (the schema's bound)
        value = [*listed, listed[0]]
        doc.setdefault("evaluation", {})["predict"] = False
    elif rule.field_path == ".draft.blockSize":
        # a block size on a method without blocks (eagle3: its other rules hold whatever the k's)
        doc.setdefault("draft", {})["method"] = "eagle3"
        doc["draft"].pop("candidates", None)  # no dflash among them either
        value = draw(st.integers(2, 32))
    elif rule.field_path == ".dataset.format":
        doc.setdefault("regeneration", {})["enabled"] = False
        value = "prompts"
    elif rule.field_path == ".serving.pinnedCheckpoint":
        doc.setdefault("serving", {})["enabled"] = False
        value = {"path": "/artifacts/run/draft"}
    elif rule.field_path in (".extraction.transfer", ".extraction.keep", ".extraction.servers"):
        # offline with every online-only field at its default, then the one field set
        doc.setdefault("extraction", {}).update(
            mode="offline", transfer="volume", keep=False, servers=1, dtype="bfloat16"
        )
        value = {
            ".extraction.transfer": "mooncake",
            ".extraction.keep": True,
            ".extraction.servers": draw(st.integers(2, 256)),
        }[rule.field_path]
    elif rule.field_path == ".extraction.dtype":
        # online: draft.candidates need offline extraction (their own rule), so a spec with none
        assume(not doc.get("draft", {}).get("candidates"))
        doc.setdefault("extraction", {}).update(mode="online", transfer="mooncake")
        value = "fp8"
    elif rule.field_path == ".serving.speculationLength":
        doc.setdefault("evaluation", {}).pop("sweep", None)
        doc.setdefault("serving", {}).pop("pinnedCheckpoint", None)
        value = "tuned"
    elif rule.field_path == ".serving.canary.timeout":
        canary = doc.setdefault("serving", {}).setdefault("canary", {})
        seconds = duration_seconds(canary.setdefault("duration", "10m"))
        canary["timeout"] = draw(st.sampled_from(["0s", f"{seconds}s", f"{max(seconds - 1, 0)}s"]))
        return
    elif rule.field_path in (".pod.tolerations", ".nodePool.tolerations"):
        section = rule.field_path.split(".")[1]
        broken = draw(
            st.sampled_from(
                [
                    {"key": "gpu", "operator": "Exists", "value": "x"},
                    {"key": "gpu", "operator": "Equal", "value": "x", "tolerationSeconds": 30},
                    {"key": "gpu", "effect": "NoSchedule", "tolerationSeconds": 30},
                    {"operator": "Equal", "value": "x"},
                    {"key": "", "effect": "NoSchedule"},
                ]
            )
        )
        kept = doc.get(section, {}).get("tolerations", [])[:2]
        doc.setdefault(section, {})["tolerations"] = [*kept, broken]
        return
    elif rule.field_path in (".pod.labels", ".pod.annotations"):
        field = rule.field_path.split(".")[2]
        doc.setdefault("pod", {})[field] = {draw(st.sampled_from(["a=b", "-x", "x" * 64, "A.b/c"])): "v"}
        return
    elif rule.field_path in (".evaluation.numSpeculativeTokens", ".evaluation.predict"):
        # P-EAGLE: more than its 8 depths a step, or a prediction (EAGLE-3's references); the other kept
        doc.setdefault("draft", {})["method"] = "peagle"
        doc["draft"].pop("candidates", None)  # whose own rules would break too
        doc["draft"].pop("blockSize", None)  # DFlash's only
        evaluation, serving = doc.setdefault("evaluation", {}), doc.setdefault("serving", {})
        serving["numSpeculativeTokens"] = min(eff["serving"]["numSpeculativeTokens"], 8)
        if evaluation.get("sweep"):
            evaluation["sweep"]["numSpeculativeTokens"] = sorted(
                {min(k, 8) for k in eff["evaluation"]["sweep"]["numSpeculativeTokens"]}
            )
        if rule.field_path == ".evaluation.predict":
            evaluation["numSpeculativeTokens"] = min(eff["evaluation"]["numSpeculativeTokens"], 8)
            value = True
        else:
            evaluation["predict"] = False
            value = draw(st.integers(9, 16))
    elif rule.field_path == ".nodePool.nodeSelector":
        key = draw(st.sampled_from(["a=b", "-x", "x" * 64, "A.b/c", "gpu type"]))
        doc.setdefault("nodePool", {})["nodeSelector"] = {key: "v"}
        return
    elif rule.field_path == ".pod.env" and "valueFrom" in rule.rule:
        kept = doc.get("pod", {}).get("env", [])[:3]
        source = {"secretKeyRef": {"name": "hf", "key": "token"}}
        value = [
            *kept,
            {"name": "HF_TOKEN", "value": draw(st.text(min_size=1, max_size=4)), "valueFrom": source},
        ]
    elif rule.field_path == ".pod.env":
        kept = doc.get("pod", {}).get("env", [])[:3]
        value = [
            *kept,
            {"name": "EAGLE3_" + draw(st.from_regex(r"[A-Z_]{1,12}", fullmatch=True)), "value": "x"},
        ]
    else:  # training.sequenceLength, extraction.tokenBudget: at least dataset.maxSequenceLength
        assume(max_len > 16)
        value = draw(st.integers(16, max_len - 1))
    parts = tuple(rule.field_path.strip(".").split("."))
    doc.setdefault(parts[0], {})[parts[1]] = value


@st.composite
def rule_breaks(draw: st.DrawFn) -> tuple[dict[str, Any], CrossFieldRule]:
    doc, rule = draw(valid_specs()), draw(st.sampled_from(RULES))
    _break(rule, doc, draw)
    return doc, rule


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)


def problems_of(doc: Any) -> list[str]:
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec(doc)
    assert caught.value.problems, "InvalidSpecError without problems"
    return caught.value.problems


# --- property-based ------------------------------------------------------------------------------------


@FAST
@given(valid_specs())
def test_valid_specs_parse_and_round_trip(doc: dict[str, Any]) -> None:
    spec = parse_spec(doc)
    assert parse_spec(spec_document(spec)) == spec


@FAST
@given(field_mutations())
def test_a_broken_field_is_reported_at_its_path_only(case: tuple[dict[str, Any], str, str]) -> None:
    doc, reported, what = case
    problems = problems_of(doc)
    assert all(p.startswith(f"{reported}: ") for p in problems), f"{what} at {reported}: {problems}"


@FAST
@given(field_mutations())
def test_the_crd_rejects_what_parse_spec_rejects(case: tuple[dict[str, Any], str, str]) -> None:
    """Range and type mutations fail the CRD schema too (unknown keys: the API server prunes them)."""
    doc, reported, what = case
    assume(not what.startswith("unknown key"))
    errors = list(crd_validator(spec_schema()).iter_errors(doc))
    assert errors, f"CRD schema accepts {what} at {reported}"


@FAST
@given(root_unknown_keys())
def test_unknown_top_level_keys_are_reported(case: tuple[dict[str, Any], str]) -> None:
    doc, reported = case
    assert problems_of(doc) == [f"{reported}: Extra inputs are not permitted"]


def test_an_integer_beyond_int64_is_refused_before_the_schema_check() -> None:
    """Even under an unknown key: the API server cannot decode the number, so it never reaches the schema."""
    doc = {**minimal(), "A": INT64_MAX + 1}
    assert problems_of(doc) == [
        f"spec.A: {INT64_MAX + 1} does not fit a 64-bit integer ({INT64_MIN} to {INT64_MAX})"
    ]


@FAST
@given(rule_breaks())
def test_a_broken_rule_is_reported_at_its_field_with_its_message(
    case: tuple[dict[str, Any], CrossFieldRule],
) -> None:
    doc, rule = case
    assert problems_of(doc) == [f"spec{rule.field_path}: {rule.message}"]
    assert not cel_holds(rule.rule, defaulted(doc))


@FAST
@given(JSON)
def test_arbitrary_json_raises_only_invalid_spec_error(value: Any) -> None:
    try:
        parse_spec(value)
    except InvalidSpecError as exc:
        assert exc.problems and all(p.startswith("spec") for p in exc.problems)


@FAST
@given(
    valid_specs().flatmap(
        lambda doc: st.tuples(st.just(doc), st.sampled_from(list(walk_values(spec_schema(), doc))), JSON)
    )
)
def test_arbitrary_subtrees_raise_only_invalid_spec_error(case: tuple[dict[str, Any], Any, Any]) -> None:
    doc, (path, _), value = case
    set_path(doc, path, value)
    try:
        parse_spec(doc)
    except InvalidSpecError as exc:
        assert all(p.startswith("spec") for p in exc.problems)


# --- explicit messages ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, [], "verifier: x", 3])
def test_not_an_object(value: Any) -> None:
    assert problems_of(value) == [f"spec: expected an object, got {type(value).__name__}"]


def test_missing_required_fields() -> None:
    assert problems_of({}) == ["spec.verifier: Field required", "spec.dataset: Field required"]
    assert problems_of({"verifier": {}, "dataset": {"source": "d"}}) == [
        "spec.verifier.model: Field required"
    ]


@pytest.mark.parametrize(
    ("patch", "problem"),
    [
        ({"training": {"gpus": 65}}, "spec.training.gpus: Input should be less than or equal to 64"),
        (
            {"training": {"gpus": "two"}},
            "spec.training.gpus: Input should be a valid integer",
        ),
        ({"trainig": {}}, "spec.trainig: Extra inputs are not permitted"),
        (
            {"verifier": {"model": "m", "vllmArgs": ["--x"] * 65}},
            "spec.verifier.vllmArgs: List should have at most 64 items",
        ),
        ({"training": {"gpu": 2}}, "spec.training.gpu: Extra inputs are not permitted"),
        (
            {"extraction": {"layers": [3, -1]}},
            "spec.extraction.layers[1]: Input should be greater than or equal to 0",
        ),
        (
            {"dataset": {"source": "d", "format": "csv"}},
            "spec.dataset.format: Input should be 'auto', 'sharegpt', 'messages', 'prompts' or 'captured'",
        ),
        ({"queueName": "Team A"}, "spec.queueName: String should match pattern"),
        (
            {"storage": {"artifacts": {"size": [500]}}},
            "spec.storage.artifacts.size: Input should be an integer or a quantity string such as '500Gi'",
        ),
        (
            {"nodePool": {"tolerations": [{"operator": "Maybe"}]}},
            "spec.nodePool.tolerations[0].operator: String should match pattern",
        ),
        (
            {"stages": {"train": {"resources": {"limits": {"memory": 1.5}}}}},
            "spec.stages.train.resources.limits.memory: Input should be an integer or a quantity string",
        ),
    ],
)
def test_field_messages(patch: dict[str, Any], problem: str) -> None:
    doc = minimal() | patch
    doc["dataset"] = {**minimal()["dataset"], **patch.get("dataset", {})}
    [reported] = problems_of(doc)
    assert reported.startswith(problem)


def test_cross_field_messages_name_every_broken_rule() -> None:
    doc = minimal() | {"training": {"gpus": 9}, "verifier": {"model": "m", "tensorParallelSize": 16}}
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec(doc)
    assert caught.value.problems == [
        "spec.training.gpus: training.gpus must be at most nodePool.gpusPerNode: "
        "it is the GPUs of one training node",
        "spec.verifier.tensorParallelSize: verifier.tensorParallelSize must be at most nodePool.gpusPerNode: "
        "the verifier runs on one node",
    ]
    assert str(caught.value).startswith("invalid Eagle3Run spec: spec.training.gpus: ")
    assert isinstance(caught.value, ValueError)


def test_field_errors_come_before_rules() -> None:
    """A spec with a broken field is not also checked against the rules (they need valid fields)."""
    doc = minimal() | {"training": {"gpus": 9, "epochs": 0}}
    assert problems_of(doc) == ["spec.training.epochs: Input should be greater than or equal to 1"]


def test_an_embedded_kubernetes_type_keeps_its_value_as_given() -> None:
    term = {"matchExpressions": [{"key": "pool", "operator": "Exists"}]}
    affinity = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    }
    spec = parse_spec(minimal() | {"nodePool": {"affinity": affinity}})
    assert spec.node_pool.affinity == affinity
    assert get_path(spec_document(spec), ("nodePool", "affinity")) == affinity
    assert PRESERVE not in spec_schema()["properties"]["nodePool"]["properties"]["affinity"]


# --- the operator's default pipeline image ---------------------------------------------------------------


def test_the_operators_pipeline_image_fills_only_an_unset_one() -> None:
    from eagle3_contract.api.spec import DEFAULT_PIPELINE_IMAGE
    from eagle3_contract.api.validation import with_pipeline_image

    spec = {"verifier": {"model": "m"}, "dataset": {"source": "d"}, "images": {"vllm": "v:1"}}
    filled = with_pipeline_image(spec, "reg/pipeline:2")
    assert (
        filled["images"] == {"vllm": "v:1", "pipeline": "reg/pipeline:2"} and "pipeline" not in spec["images"]
    )
    own = {**spec, "images": {"pipeline": "mine:3"}}
    assert with_pipeline_image(own, "reg/pipeline:2") is own
    assert with_pipeline_image(spec, None) is spec and with_pipeline_image(None, "x") is None
    assert (
        parse_spec(
            with_pipeline_image({k: v for k, v in spec.items() if k != "images"}, "r:1")
        ).images.pipeline
        == "r:1"
    )
    assert parse_spec(spec).images.pipeline is None, (
        f"unset: the builders fall back to {DEFAULT_PIPELINE_IMAGE}"
    )


# --- issue 28: spec.pod.env (items 7 and 9) -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ([{"name": "EAGLE3_DRAFT_SHA256", "value": "e3b0c442"}], "spec.pod.env: names starting EAGLE3_ are"),
        ([{"name": "A", "value": "1"}, {"name": "EAGLE3_DRAFT_WEIGHTS", "value": "/dev/null"}], "EAGLE3_"),
        ([{"name": "A=B", "value": "1"}], "spec.pod.env[0].name: String should match pattern"),
        ([{"name": "", "value": "1"}], "spec.pod.env[0].name: String should match pattern"),
        ([{"value": "1"}], "spec.pod.env[0].name: Field required"),
        ([{"name": "N", "value": 1}], "spec.pod.env[0].value: Input should be a valid string"),
        ([{"name": "N", "valu": "1"}], "spec.pod.env[0].valu: Extra inputs are not permitted"),
        (["HTTPS_PROXY=x"], "spec.pod.env[0]: Input should be an object"),
    ],
)
def test_spec_pod_env_takes_only_what_a_pod_takes_and_none_of_the_operators_variables(
    env: list[Any], problem: str
) -> None:
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec(minimal() | {"pod": {"env": env}})
    assert problem in str(caught.value), caught.value


def test_the_crd_refuses_an_env_name_a_pod_would_refuse() -> None:
    """The same names are refused by the CRD's schema (its pattern) before any operator sees them."""
    validator = crd_validator(spec_schema())
    good = defaulted(minimal() | {"pod": {"env": [{"name": "HTTPS_PROXY", "value": "x"}]}})
    assert not list(validator.iter_errors(good))
    for name in ("A=B", "", "1ABC"):
        bad = defaulted(minimal() | {"pod": {"env": [{"name": name, "value": "x"}]}})
        assert list(validator.iter_errors(bad)), name
    assert cel_holds(RULES[-1].rule, good) and not cel_holds(
        RULES[-1].rule, defaulted(minimal() | {"pod": {"env": [{"name": "EAGLE3_STAGE", "value": "x"}]}})
    )


@pytest.mark.parametrize(
    ("canary", "problem"),
    [
        ({"timeout": "0s"}, "spec.serving.canary.timeout: serving.canary.timeout must be longer than"),
        ({"duration": "2h", "timeout": "2h"}, "spec.serving.canary.timeout: "),
        ({"duration": "3h"}, "spec.serving.canary.timeout: "),  # the default timeout is 2h
        ({"prometheusUrl": "http://"}, "spec.serving.canary.prometheusUrl: String should match pattern"),
        (
            {"prometheusUrl": "http://prom etheus:9090"},
            "spec.serving.canary.prometheusUrl: String should match",
        ),
        (
            {"prometheusUrl": "http://prometheus:9090\n"},
            "spec.serving.canary.prometheusUrl: String should match",
        ),
        ({"timeout": "100000h"}, "spec.serving.canary.timeout: String should match pattern"),
    ],
)
def test_a_canary_that_could_never_decide_is_refused_naming_the_field(
    canary: dict[str, Any], problem: str
) -> None:
    """Issue 28, item 10: each was accepted; the canary always rolled back, or could reach no Prometheus."""
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec(minimal() | {"serving": {"canary": canary}})
    assert str(caught.value).startswith(f"invalid Eagle3Run spec: {problem}"), caught.value
    parse_spec(minimal() | {"serving": {"canary": {"prometheusUrl": "http://prometheus.monitoring:9090/x"}}})


@pytest.mark.parametrize("section", ["pod", "nodePool"])
@pytest.mark.parametrize(
    "toleration",
    [
        {"key": "nvidia.com/gpu", "operator": "Exists", "value": "present"},
        {"key": "nvidia.com/gpu", "effect": "NoSchedule", "tolerationSeconds": 300},
    ],
)
def test_a_toleration_the_api_server_would_refuse_is_refused_when_applied(
    section: str, toleration: dict[str, Any]
) -> None:
    """Issue 28, item 9: each was copied into every pod and refused by the API server at the first Job."""
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec(minimal() | {section: {"tolerations": [toleration]}})
    assert str(caught.value).startswith(f"invalid Eagle3Run spec: spec.{section}.tolerations: "), caught.value


@pytest.mark.parametrize("field", ["labels", "annotations"])
@pytest.mark.parametrize("key", ["a=b", "-lead", "UPPER.example.com/x", "a/b/c", "x" * 64, "", "b k"])
def test_a_label_or_annotation_key_the_api_server_refuses_is_refused(field: str, key: str) -> None:
    """Issue 28, item 9: such keys were copied into every pod and the API server refused the first Job."""
    with pytest.raises(InvalidSpecError) as caught:
        parse_spec(minimal() | {"pod": {field: {key: "v"}}})
    assert str(caught.value).startswith(f"invalid Eagle3Run spec: spec.pod.{field}: "), caught.value
    assert parse_spec(minimal() | {"pod": {field: {"example.com/team": "a", "app_x.y-z": "b"}}})


def test_an_annotation_over_the_api_servers_size_limit_is_refused() -> None:
    with pytest.raises(InvalidSpecError, match=r"spec\.pod\.annotations\.big: String should have at most"):
        parse_spec(minimal() | {"pod": {"annotations": {"big": "x" * 300_000}}})


def test_annotations_over_the_limit_together_are_refused() -> None:
    """The API server limits all of a pod's annotations together (256 KiB): two of 150 KB each, each under
    the limit, were accepted and the pods refused (issue 28 item 9)."""
    two = {"a": "x" * 150_000, "b": "y" * 150_000}
    with pytest.raises(
        InvalidSpecError, match=r"spec\.pod: annotations of 300,002 bytes .* keep them to 258,048"
    ):
        parse_spec(minimal() | {"pod": {"annotations": two}})
    fits = {"a": "x" * 120_000, "b": "y" * 120_000}
    assert parse_spec(minimal() | {"pod": {"annotations": fits}}).pod.annotations == fits
