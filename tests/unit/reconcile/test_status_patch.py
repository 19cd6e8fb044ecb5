"""merge_patch: the JSON merge patch (RFC 7386) applied to the old status must give the new one."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from eagle3_operator.reconcile.status_patch import merge_patch
from tests.unit.reconcile.planner_world import apply_merge_patch

KEYS = st.sampled_from(["phase", "stages", "kopf", "a", "b", "result"])
# No null: a status document has none (exclude_none), and in a merge patch null means "delete".
SCALARS = st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) | st.text(max_size=3)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=12,
)
DOCS = st.dictionaries(KEYS, JSON, max_size=5)


def similar(old: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A document sharing part of `old`: some keys kept, some changed, some dropped, some added."""
    return st.fixed_dictionaries(
        {}, optional={k: st.just(v) | JSON for k, v in old.items()} | {"added": JSON}
    )


PAIRS = DOCS.flatmap(lambda old: st.tuples(st.just(old), similar(old) | DOCS))


@settings(max_examples=300, deadline=None)
@given(PAIRS)
def test_the_patch_turns_old_into_new(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    old, new = pair
    before = copy.deepcopy(old)
    patch = merge_patch(old, new)
    assert apply_merge_patch(old, patch) == new
    assert old == before, "merge_patch must not change its input"
    assert (patch == {}) == (old == new)


@settings(max_examples=300, deadline=None)
@given(PAIRS)
def test_ignored_keys_are_never_deleted(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    old, new = pair
    patch = merge_patch(old, new, ignore=("kopf",))
    expected = dict(new)
    if "kopf" in old and "kopf" not in new:
        expected["kopf"] = old["kopf"]  # kopf's own progress storage stays
    assert apply_merge_patch(old, patch) == expected
    assert patch.get("kopf", "absent") is not None


@settings(max_examples=200, deadline=None)
@given(PAIRS)
def test_the_patch_names_only_what_changed(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    old, new = pair
    patch = merge_patch(old, new)
    for key in old.keys() & new.keys():
        if old[key] == new[key]:
            assert key not in patch
    assert set(patch) <= old.keys() | new.keys()


def test_examples() -> None:
    old = {"phase": "Running", "stages": {"prepare": {"phase": "Running", "jobName": "j"}}, "kopf": {"x": 1}}
    new = {"phase": "Failed", "stages": {"prepare": {"phase": "Failed", "message": "boom"}}}
    assert merge_patch(old, new, ignore=("kopf",)) == {
        "phase": "Failed",
        "stages": {"prepare": {"phase": "Failed", "message": "boom", "jobName": None}},
    }
    assert merge_patch(old, new) == {
        "phase": "Failed",
        "kopf": None,
        "stages": {"prepare": {"phase": "Failed", "message": "boom", "jobName": None}},
    }
    assert merge_patch({"conditions": [1, 2]}, {"conditions": [2]}) == {"conditions": [2]}  # lists whole
    assert merge_patch({"a": {"b": 1}}, {"a": 3}) == {"a": 3}
    assert merge_patch({"a": 3}, {"a": {"b": 1}}) == {"a": {"b": 1}}
    assert merge_patch({}, {"a": {}}) == {"a": {}}
    assert merge_patch(new, new) == {}
