"""Child names, labels and metadata."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from eagle3_operator.builders import names
from eagle3_operator.builders.names import RunRef

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
RUN_NAMES = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,250}[a-z0-9])?", fullmatch=True)


def test_short_names_are_kept() -> None:
    assert names.child_name("run", "vllm") == "run-vllm"
    assert names.job_name("run", "train", "0123456789ab", 0) == "run-train-0123456789ab"
    assert names.job_name("run", "train", "0123456789ab", 2) == "run-train-0123456789ab-r2"
    assert names.spec_configmap_name("run", "abc") == "run-spec-abc"
    assert names.artifacts_claim_name("run") == "run-artifacts"
    assert names.serving_name("run") == "run-vllm"


@settings(deadline=None)  # a pure function: a loaded machine's pause is no failure
@given(RUN_NAMES, st.sampled_from(["prepare", "evaluate"]), st.integers(0, 99))
def test_long_names_are_cut_salted_and_valid(run: str, stage: str, attempt: int) -> None:
    name = names.job_name(run, stage, "0123456789ab", attempt)
    assert len(name) <= names.MAX_NAME
    assert DNS_LABEL.match(name), name
    assert name == names.job_name(run, stage, "0123456789ab", attempt)
    assert name.endswith(f"-{stage}-0123456789ab" + (f"-r{attempt}" if attempt else ""))
    assert DNS_LABEL.match(names.labels(run, stage)[names.LABEL_RUN])
    assert len(names.labels(run, stage)[names.LABEL_RUN]) <= names.MAX_NAME


def test_long_names_sharing_a_prefix_differ() -> None:
    a, b = "a" * 80 + "-one", "a" * 80 + "-two"
    assert names.serving_name(a) != names.serving_name(b)
    assert names.labels(a, "x")[names.LABEL_RUN] != names.labels(b, "x")[names.LABEL_RUN]


def test_metadata() -> None:
    run = RunRef("r", "ns", "uid-1")
    meta = names.metadata(run, "r-x", "x", labels={"extra": "1"}, annotations={"a": "b"})
    assert meta == {
        "name": "r-x",
        "namespace": "ns",
        "labels": names.labels("r", "x") | {"extra": "1"},
        "annotations": {"a": "b"},
        "ownerReferences": [run.owner_reference()],
    }
    bare = names.metadata(run, "r-x", "x", owned=False, annotations={})
    assert "annotations" not in bare and "ownerReferences" not in bare


def test_runs_whose_names_differ_only_by_dots_get_distinct_children_and_labels():
    from eagle3_operator.builders.names import child_name, run_label

    assert child_name("a.b", "vllm") != child_name("a-b", "vllm")
    assert child_name("a-b", "vllm") == "a-b-vllm"
    assert run_label("a.b") != run_label("a-b")
    assert child_name("7b-run", "vllm")[0].isalpha()
    long = "x" * 80
    assert len(run_label(long)) <= 63 and run_label(long) != run_label(long + "y")
