"""The CEL rules in the CRD and their Python twins in rules.py give the same verdict on every spec.

CEL runs on the spec as the API server stores it: CRD defaults applied, absent optionals absent (so `has()` is
false for them), and values typed by the schema (a `number` is a double even when written as 1).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagle3_contract.api.rules import RULES, CrossFieldRule
from tests.contract.api.api_support import (
    cel_holds,
    cel_program,
    defaulted,
    python_holds,
    set_path,
    spec_schema,
    valid_specs,
)
from tests.tiny_spec import minimal

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def key(rule: CrossFieldRule) -> str:
    """A rule's name here: its field path, and for a second rule on the same field what it is about."""
    return f"{rule.field_path}/valueFrom" if "valueFrom" in rule.rule else rule.field_path


BY_PATH = {key(rule): rule for rule in RULES}
assert len(BY_PATH) == len(RULES), "two rules share a name: extend key()"

_SECRET = {"secretKeyRef": {"name": "hf", "key": "token"}}
# (rule field path, patch of (dotted path, value) onto the minimal spec, does the rule hold?)
CASES: list[tuple[str, dict[str, Any], bool]] = [
    (".dataset.format", {}, True),
    (".dataset.format", {"dataset.format": "sharegpt"}, True),
    (".dataset.format", {"dataset.format": "prompts", "regeneration.enabled": True}, True),
    (".dataset.format", {"dataset.format": "prompts"}, False),
    (".training.gpus", {}, True),
    (".training.gpus", {"training.gpus": 8}, True),
    (".training.gpus", {"training.gpus": 9}, False),
    (".training.gpus", {"training.gpus": 16, "nodePool.gpusPerNode": 16}, True),
    (".training.gpus", {"training.gpus": 2, "nodePool.gpusPerNode": 1}, False),
    # CPU mode: training.gpus is the training processes of a node, not bounded by gpusPerNode
    (".training.gpus", {"training.gpus": 9, "nodePool.device": "cpu"}, True),
    (".training.gpus", {"training.gpus": 9, "nodePool.device": "gpu"}, False),
    (".verifier.tensorParallelSize", {"verifier.tensorParallelSize": 8}, True),
    (".verifier.tensorParallelSize", {"verifier.tensorParallelSize": 9}, False),
    (".verifier.tensorParallelSize", {"verifier.tensorParallelSize": 4, "nodePool.gpusPerNode": 2}, False),
    (
        ".verifier.tensorParallelSize",
        {"verifier.tensorParallelSize": 4, "nodePool.gpusPerNode": 2, "nodePool.device": "cpu"},
        True,
    ),
    # draft.method peagle: at most PARALLEL_DEPTHS (8) tokens a step wherever a k is set; no prediction
    (".evaluation.numSpeculativeTokens", {}, True),
    (".evaluation.numSpeculativeTokens", {"evaluation.numSpeculativeTokens": 12}, True),
    (
        ".evaluation.numSpeculativeTokens",
        {"draft.method": "peagle", "evaluation.numSpeculativeTokens": 8},
        True,
    ),
    (
        ".evaluation.numSpeculativeTokens",
        {"draft.method": "peagle", "evaluation.numSpeculativeTokens": 9},
        False,
    ),
    (
        ".evaluation.numSpeculativeTokens",
        {"draft.method": "peagle", "serving.numSpeculativeTokens": 9},
        False,
    ),
    (
        ".evaluation.numSpeculativeTokens",
        {"draft.method": "peagle", "evaluation.sweep": {"numSpeculativeTokens": [2, 8]}},
        True,
    ),
    (
        ".evaluation.numSpeculativeTokens",
        {"draft.method": "peagle", "evaluation.sweep": {"numSpeculativeTokens": [2, 9]}},
        False,
    ),
    # draft.method dflash: at most blockSize - 1 tokens a step (16 - 1 by default); blockSize is DFlash's only
    (".draft.blockSize", {}, True),
    (".draft.blockSize", {"draft.blockSize": 4}, False),
    (".draft.blockSize", {"draft.method": "peagle", "draft.blockSize": 4}, False),
    (".draft.blockSize", {"draft.method": "dflash"}, True),
    (".draft.blockSize", {"draft.method": "dflash", "evaluation.numSpeculativeTokens": 15}, True),
    (".draft.blockSize", {"draft.method": "dflash", "evaluation.numSpeculativeTokens": 16}, False),
    (".draft.blockSize", {"draft.method": "dflash", "draft.blockSize": 4}, True),
    (".draft.blockSize", {"draft.method": "dflash", "draft.blockSize": 3}, False),
    (
        ".draft.blockSize",
        {"draft.method": "dflash", "draft.blockSize": 8, "serving.numSpeculativeTokens": 8},
        False,
    ),
    (
        ".draft.blockSize",
        {
            "draft.method": "dflash",
            "draft.blockSize": 8,
            "evaluation.sweep": {"numSpeculativeTokens": [2, 7]},
        },
        True,
    ),
    (
        ".draft.blockSize",
        {
            "draft.method": "dflash",
            "draft.blockSize": 8,
            "evaluation.sweep": {"numSpeculativeTokens": [2, 8]},
        },
        False,
    ),
    # draft.candidates: each once, draft.method among them, one node, offline, the best by validation loss
    (".draft.candidates", {"draft.candidates": ["eagle3", "dflash"]}, True),
    (".draft.candidates", {"draft.candidates": ["eagle3", "peagle", "dflash"]}, True),
    (".draft.candidates", {"draft.candidates": ["peagle", "dflash"]}, False),
    (".draft.candidates", {"draft.method": "peagle", "draft.candidates": ["peagle", "dflash"]}, True),
    (".draft.candidates", {"draft.candidates": ["eagle3", "eagle3"]}, False),
    (".draft.candidates", {"draft.candidates": ["eagle3", "dflash"], "training.nodes": 2}, False),
    (".draft.candidates", {"draft.candidates": ["eagle3", "dflash"], "extraction.mode": "online"}, False),
    (
        ".draft.candidates",
        {"draft.candidates": ["eagle3", "dflash"], "training.checkpointSelection": "acceptance"},
        False,
    ),
    # training-free rivals: one trained method trains as without candidates (any nodes, online too)
    (".draft.candidates", {"draft.candidates": ["eagle3", "ngram"], "training.nodes": 2}, True),
    (
        ".draft.candidates",
        {"draft.candidates": ["eagle3", "ngram", "suffix"], "extraction.mode": "online"},
        True,
    ),
    (".draft.candidates", {"draft.candidates": ["eagle3", "peagle", "ngram"], "training.nodes": 2}, False),
    (".draft.candidates", {"draft.candidates": ["ngram", "suffix"]}, False),  # draft.method is trained
    (".draft.candidates", {"draft.candidates": ["eagle3", "ngram", "ngram"]}, False),
    # the candidates' own rules: P-EAGLE's depths, DFlash's block, no prediction
    (
        ".evaluation.numSpeculativeTokens",
        {"draft.candidates": ["eagle3", "peagle"], "serving.numSpeculativeTokens": 9},
        False,
    ),
    (".draft.blockSize", {"draft.candidates": ["eagle3", "dflash"], "draft.blockSize": 4}, True),
    (".draft.blockSize", {"draft.candidates": ["eagle3", "dflash"], "draft.blockSize": 3}, False),
    (".evaluation.predict", {"draft.candidates": ["eagle3", "dflash"], "evaluation.predict": True}, False),
    (".evaluation.predict", {"evaluation.predict": True}, True),
    (".evaluation.predict", {"draft.method": "peagle"}, True),
    (".evaluation.predict", {"draft.method": "dflash", "evaluation.predict": True}, False),
    (".evaluation.predict", {"draft.method": "peagle", "evaluation.predict": True}, False),
    (".extraction.layers", {}, True),
    (".extraction.layers", {"extraction.layers": [0]}, True),
    (".extraction.layers", {"extraction.layers": [2, 16, 29, 32]}, True),
    (".extraction.layers", {"extraction.layers": [1, 1]}, False),
    (".extraction.layers", {"extraction.layers": [5, 3, 5]}, False),
    (".training.sequenceLength", {}, True),
    (".training.sequenceLength", {"dataset.maxSequenceLength": 8192}, True),
    (".training.sequenceLength", {"dataset.maxSequenceLength": 8193}, False),
    (".training.sequenceLength", {"training.sequenceLength": 2047}, False),
    (".extraction.tokenBudget", {"extraction.tokenBudget": 2048}, True),
    (".extraction.tokenBudget", {"extraction.tokenBudget": 2047}, False),
    (".verifier.maxModelLen", {}, True),
    (".verifier.maxModelLen", {"verifier.maxModelLen": 2048}, True),
    (".verifier.maxModelLen", {"verifier.maxModelLen": 2047}, False),
    (".verifier.maxModelLen", {"verifier.maxModelLen": 128, "dataset.maxSequenceLength": 128}, True),
    (".extraction.transfer", {}, True),
    (".extraction.transfer", {"extraction.mode": "online", "extraction.transfer": "mooncake"}, True),
    (".extraction.transfer", {"extraction.transfer": "mooncake"}, False),
    (".extraction.keep", {"extraction.mode": "online", "extraction.keep": True}, True),
    (".extraction.keep", {"extraction.keep": True}, False),
    (".extraction.servers", {"extraction.mode": "online", "extraction.servers": 2}, True),
    (".extraction.servers", {"extraction.servers": 2}, False),
    (".extraction.dtype", {"extraction.mode": "online", "extraction.dtype": "fp8"}, True),
    (
        ".extraction.dtype",
        {"extraction.mode": "online", "extraction.transfer": "mooncake", "extraction.dtype": "fp8"},
        False,
    ),
    (".serving.pinnedCheckpoint", {}, True),
    (".serving.pinnedCheckpoint", {"serving.pinnedCheckpoint": {"path": "/artifacts/run/draft"}}, True),
    (".serving.pinnedCheckpoint", {"serving.enabled": False}, True),
    (
        ".serving.pinnedCheckpoint",
        {"serving.pinnedCheckpoint": {"path": "/artifacts/run/draft"}, "serving.enabled": False},
        False,
    ),
    (".serving.speculationLength", {}, True),
    (".serving.speculationLength", {"serving.speculationLength": "tuned", "evaluation.sweep": {}}, True),
    (
        ".serving.speculationLength",
        {"serving.speculationLength": "tuned", "serving.pinnedCheckpoint": {"path": "/artifacts/run/draft"}},
        True,
    ),
    (".serving.speculationLength", {"serving.speculationLength": "tuned"}, False),
    (".serving.canary.timeout", {}, True),
    (".serving.canary.timeout", {"serving.canary": {}}, True),  # 10m, then 2h
    (".serving.canary.timeout", {"serving.canary": {"duration": "10m", "timeout": "10m1s"}}, True),
    (".serving.canary.timeout", {"serving.canary": {"duration": "10m", "timeout": "10m"}}, False),
    (".serving.canary.timeout", {"serving.canary": {"duration": "1h30m", "timeout": "90m"}}, False),
    (".serving.canary.timeout", {"serving.canary": {"timeout": "0s"}}, False),
    (".pod.tolerations", {}, True),
    (".pod.tolerations", {"pod.tolerations": [{"operator": "Exists"}]}, True),
    (".pod.tolerations", {"pod.tolerations": [{"key": "k", "operator": "Exists", "value": ""}]}, True),
    (".pod.tolerations", {"pod.tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, False),
    (
        ".pod.tolerations",
        {"pod.tolerations": [{"key": "k", "effect": "NoExecute", "tolerationSeconds": 60}]},
        True,
    ),
    # no key: every taint, with operator Exists only (an Equal's empty key matches no taint: refused)
    (".pod.tolerations", {"pod.tolerations": [{"effect": "NoExecute", "tolerationSeconds": 60}]}, False),
    (".pod.tolerations", {"pod.tolerations": [{"key": "", "operator": "Equal"}]}, False),
    (".pod.tolerations", {"pod.tolerations": [{"key": "", "operator": "Exists"}]}, True),
    (".pod.tolerations", {"pod.tolerations": [{"effect": "NoSchedule", "tolerationSeconds": 60}]}, False),
    (".pod.tolerations", {"pod.tolerations": [{"key": "k", "tolerationSeconds": 60}]}, False),
    (".nodePool.tolerations", {"nodePool.tolerations": [{"operator": "Exists", "value": "v"}]}, False),
    (".nodePool.tolerations", {"nodePool.tolerations": [{"value": "v"}]}, False),
    (
        ".nodePool.tolerations",
        {"nodePool.tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]},
        True,
    ),
    (".pod.labels", {"pod.labels": {"example.com/team": "a", "app": "b"}}, True),
    (".pod.labels", {"pod.labels": {"a=b": "x"}}, False),
    (".pod.labels", {"pod.labels": {"Upper.example.com/x": "x"}}, False),
    (".pod.annotations", {"pod.annotations": {"k8s.io/x": "y"}}, True),
    (".pod.annotations", {"pod.annotations": {"x" * 64: "y"}}, False),
    (".nodePool.nodeSelector", {}, True),
    (".nodePool.nodeSelector", {"nodePool.nodeSelector": {"cloud.google.com/gke-nodepool": "gpu"}}, True),
    (".nodePool.nodeSelector", {"nodePool.nodeSelector": {"gpu type": "a100"}}, False),
    (".nodePool.nodeSelector", {"nodePool.nodeSelector": {"a/b/c": ""}}, False),
    (".pod.env/valueFrom", {}, True),
    (
        ".pod.env/valueFrom",
        {"pod.env": [{"name": "A", "value": "x"}, {"name": "B", "valueFrom": _SECRET}]},
        True,
    ),
    (".pod.env/valueFrom", {"pod.env": [{"name": "A", "value": "", "valueFrom": _SECRET}]}, True),
    (".pod.env/valueFrom", {"pod.env": [{"name": "A", "value": "x", "valueFrom": _SECRET}]}, False),
    (".pod.env", {}, True),
    (".pod.env", {"pod.env": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]}, True),
    (".pod.env", {"pod.env": [{"name": "MY_EAGLE3_HOME", "value": "x"}]}, True),
    (".pod.env", {"pod.env": [{"name": "EAGLE3_DRAFT_SHA256", "value": "e3b0c442"}]}, False),
    (
        ".pod.env",
        {"pod.env": [{"name": "A", "value": "1"}, {"name": "EAGLE3_DRAFT_WEIGHTS", "value": "/x"}]},
        False,
    ),
]


def patched(patch: dict[str, Any]) -> dict[str, Any]:
    doc = minimal()
    for dotted, value in patch.items():
        parts = tuple(dotted.split("."))
        parent: dict[str, Any] = doc
        for part in parts[:-1]:
            parent = parent.setdefault(part, {})
        set_path(doc, parts, value)
    return doc


def assert_twins_agree(doc: dict[str, Any]) -> None:
    stored = defaulted(doc)
    for rule in RULES:
        assert cel_holds(rule.rule, stored) == python_holds(rule, doc), (
            f"{rule.field_path} disagrees on {doc}"
        )


@pytest.mark.parametrize("rule", RULES, ids=[key(r) for r in RULES])
def test_rule_compiles_and_names_real_fields(rule: CrossFieldRule) -> None:
    cel_program(rule.rule)
    schema = spec_schema()
    for reference in re.findall(r"self((?:\.\w+(?![\w(]))+)", rule.rule):
        node = schema
        for name in reference.strip(".").split("."):
            assert name in node.get("properties", {}), f"{rule.rule!r}: no field {reference}"
            node = node["properties"][name]
    target = schema
    for name in rule.field_path.strip(".").split("."):
        target = target["properties"][name]
    assert rule.to_crd() == {
        "rule": rule.rule,
        "message": rule.message,
        "fieldPath": rule.field_path,
        "reason": "FieldValueInvalid",
    }


@pytest.mark.parametrize(
    ("path", "patch", "holds"), CASES, ids=[f"{c[0]}-{c[2]}-{i}" for i, c in enumerate(CASES)]
)
def test_hand_picked_cases(path: str, patch: dict[str, Any], holds: bool) -> None:
    doc = patched(patch)
    rule = BY_PATH[path]
    assert python_holds(rule, doc) is holds
    assert cel_holds(rule.rule, defaulted(doc)) is holds
    assert_twins_agree(doc)


def test_every_rule_has_a_holding_and_a_breaking_case() -> None:
    assert {(path, holds) for path, _, holds in CASES} == {(key(r), h) for r in RULES for h in (True, False)}


def test_has_is_false_for_absent_optionals() -> None:
    """Unset optionals are absent from the stored object (never null), and CEL `has()` says so."""
    stored = defaulted(minimal())
    assert "layers" not in stored["extraction"] and "maxModelLen" not in stored["verifier"]
    for field in ("self.extraction.layers", "self.verifier.maxModelLen", "self.serving.pinnedCheckpoint"):
        assert cel_holds(f"!has({field})", stored)
    stored = defaulted(patched({"extraction.layers": [3], "verifier.maxModelLen": 4096}))
    assert cel_holds("has(self.extraction.layers) && has(self.verifier.maxModelLen)", stored)


def test_numbers_are_doubles_even_when_written_as_integers() -> None:
    stored = defaulted(patched({"training.learningRate": 1}))
    assert cel_holds("self.training.learningRate == 1.0", stored)
    assert cel_holds("self.training.gpus == 1", stored)


SIZES = st.sampled_from([16, 127, 128, 129, 2047, 2048, 2049, 8191, 8192, 8193, 1_048_576])
GPUS = st.integers(1, 64) | st.sampled_from([1, 2, 7, 8, 9, 63, 64])


def _near(anchor: st.SearchStrategy[int], low: int, high: int) -> st.SearchStrategy[tuple[int, int]]:
    """(a, b) with b at, just below or just above a: the boundary of a `b <= a` or `b >= a` rule."""
    return anchor.flatmap(
        lambda a: st.tuples(
            st.just(a), st.integers(max(low, a - 2), min(high, a + 2)) | st.integers(low, high)
        )
    )


@st.composite
def rule_boundary_specs(draw: st.DrawFn) -> dict[str, Any]:
    """Specs whose rule-touched fields sit on, or one or two past, each rule's boundary; optionals vary."""
    per_node, gpus = draw(_near(GPUS, 1, 64))
    _, tp = draw(_near(st.just(per_node), 1, 64))
    patch: dict[str, Any] = {"nodePool.gpusPerNode": per_node, "training.gpus": gpus}
    patch["verifier.tensorParallelSize"] = tp
    patch["nodePool.device"] = draw(st.sampled_from(["gpu", "cpu"]))
    length, seq = draw(_near(SIZES, 16, 1_048_576))
    patch |= {"dataset.maxSequenceLength": length, "training.sequenceLength": seq}
    patch["extraction.tokenBudget"] = draw(
        st.integers(max(16, length - 2), length + 2) | st.sampled_from([16, 8192])
    )
    if draw(st.booleans()):
        patch["verifier.maxModelLen"] = draw(st.integers(max(128, length - 2), max(128, length + 2)))
    if draw(st.booleans()):
        patch["extraction.layers"] = draw(st.lists(st.integers(0, 6), min_size=1, max_size=16))
    if draw(st.booleans()):
        patch["serving.pinnedCheckpoint"] = {"path": "/artifacts/draft"}
    patch["serving.enabled"] = draw(st.booleans())
    return patched({k: v for k, v in patch.items() if draw(st.integers(0, 9)) > 0})  # some left to defaults


@FAST
@given(rule_boundary_specs())
def test_twins_agree_at_the_boundaries(doc: dict[str, Any]) -> None:
    assert_twins_agree(doc)


@FAST
@given(valid_specs())
def test_every_rule_holds_on_valid_specs(doc: dict[str, Any]) -> None:
    stored = defaulted(doc)
    assert all(cel_holds(rule.rule, stored) for rule in RULES)
