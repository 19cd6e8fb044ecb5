"""stages.py: the order of the stages, which are skipped, what each needs and above all what a hash covers.

The hash is the GitOps contract: an edit re-runs exactly the stages whose output it changes. Parameters that
only change how a stage executes (batch sizes, memory fractions, placement, serving) must change no hash.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.api.validation import parse_spec
from eagle3_contract.stages import HASH_LENGTH, ORDER, Stage, StagePlan, content_hash, plan_stages, stage_argv
from tests.contract.api.api_support import defaulted, valid_specs
from tests.tiny_spec import minimal
from tests.unit.builders.builder_cases import KIMI_SPEC, TINY_SPEC, specs

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ALL = {s.value for s in Stage} - {"predict"}  # predict is off in these specs: it hashes nothing
TRAINING = ALL - {"verify"}  # verify's hash covers serving.pinnedCheckpoint only
Doc = dict[str, Any]


def plans(doc: Doc) -> dict[str, StagePlan]:
    return {p.stage.value: p for p in plan_stages(parse_spec(doc))}


def hashes(doc: Doc) -> dict[str, str]:
    return {stage: p.hash for stage, p in plans(doc).items()}


def edited(doc: Doc, section: str, **values: Any) -> Doc:
    out = copy.deepcopy(doc)
    out[section] = {**out.get(section, {}), **values}
    return out


def changed(before: Doc, after: Doc) -> set[str]:
    old, new = hashes(before), hashes(after)
    return {stage for stage in old if old[stage] != new[stage]}


# --- order, skipping, needs ----------------------------------------------------------------------------


@pytest.mark.parametrize("doc", [TINY_SPEC, KIMI_SPEC, minimal()], ids=["tiny", "kimi", "minimal"])
def test_every_stage_is_planned_in_order_with_its_output_dir(doc: Doc) -> None:
    planned = plan_stages(parse_spec(doc))
    assert [p.stage for p in planned] == list(ORDER) == list(Stage)
    assert [p.stage.value for p in planned] == [
        "predict", "prepare", "generate", "extract", "vocab", "train", "evaluate", "export", "verify",
    ]  # fmt: skip
    for p in planned:
        assert len(p.hash) == HASH_LENGTH and int(p.hash, 16) >= 0
        assert p.output_dir == f"{p.stage.value}/{p.hash}"
    assert len({p.hash for p in planned}) == len(planned)


def test_generate_is_skipped_unless_regeneration_is_enabled() -> None:
    off = plans(minimal())
    assert off["generate"].skipped is not None and "regeneration.enabled is false" in off["generate"].skipped
    assert [s for s, p in off.items() if p.skipped] == ["predict", "generate", "verify"]
    on = plans(minimal() | {"regeneration": {"enabled": True}})
    assert [s for s, p in on.items() if p.skipped] == ["predict", "verify"]
    assert on["verify"].skipped is not None and "no serving.pinnedCheckpoint" in on["verify"].skipped


@pytest.mark.parametrize("regenerate", [False, True])
def test_a_pinned_checkpoint_skips_every_stage(regenerate: bool) -> None:
    doc = minimal() | {
        "regeneration": {"enabled": regenerate},
        "serving": {"pinnedCheckpoint": {"path": "export/0123456789ab"}},
    }
    for p in plans(doc).values():
        assert p.skipped is not None and "serving.pinnedCheckpoint" in p.skipped, p.stage
    assert "sha256 is not set: the pinned draft is served unchecked" in (plans(doc)["verify"].skipped or "")


PIN = {"path": "export/0123456789ab", "sha256": "ab" * 32}


def test_a_pinned_sha256_runs_verify_alone_without_gpus_and_never_reuses_its_output() -> None:
    planned = plans(minimal() | {"serving": {"pinnedCheckpoint": PIN}})
    assert [s for s, p in planned.items() if p.skipped is None] == ["verify"]
    verify = planned["verify"]
    assert (verify.gpus, verify.uses_vllm, verify.inputs, verify.token_budget) == (0, False, {}, None)
    assert verify.reuses_output is False and not verify.retries_oom
    assert all(p.reuses_output for s, p in planned.items() if s != "verify")


def test_only_the_pin_changes_the_verify_hash() -> None:
    doc = minimal() | {"serving": {"pinnedCheckpoint": PIN}}
    other_sha = minimal() | {"serving": {"pinnedCheckpoint": PIN | {"sha256": "cd" * 32}}}
    other_path = minimal() | {"serving": {"pinnedCheckpoint": PIN | {"path": "export/ffffffffffff"}}}
    assert changed(doc, other_sha) == changed(doc, other_path) == {"verify"}
    assert changed(doc, edited(doc, "dataset", seed=7)) == TRAINING
    assert changed(doc, edited(doc, "serving", replicas=3)) == set()


def test_enabling_regeneration_feeds_extract_vocab_and_evaluate_from_generate() -> None:
    off, on = plans(minimal()), plans(minimal() | {"regeneration": {"enabled": True}})
    assert off["extract"].inputs == {"prepare": off["prepare"].output_dir}
    assert off["vocab"].inputs == {"prepare": off["prepare"].output_dir}
    assert on["generate"].inputs == {"prepare": on["prepare"].output_dir}
    assert on["extract"].inputs == {"generate": on["generate"].output_dir}
    assert on["vocab"].inputs == {"generate": on["generate"].output_dir}
    assert set(on["evaluate"].inputs) == {"generate", "train"}
    assert set(off["evaluate"].inputs) == {"prepare", "train"}
    assert on["train"].inputs == {
        "generate": on["generate"].output_dir,
        "extract": on["extract"].output_dir,
        "vocab": on["vocab"].output_dir,
    }
    assert set(off["train"].inputs) == {"prepare", "extract", "vocab"}
    assert on["export"].inputs == {"train": on["train"].output_dir, "vocab": on["vocab"].output_dir}
    # the prepared data and the generated data (a hash of its own) are the same; whatever reads them differs
    after = minimal() | {"regeneration": {"enabled": True}}
    assert changed(minimal(), after) == TRAINING - {"prepare", "generate"}


@FAST
@given(specs())
def test_gpus_and_vllm_per_stage(spec: Eagle3RunSpec) -> None:
    tp = spec.verifier.tensor_parallel_size
    planned = {p.stage: p for p in plan_stages(spec)}
    wanted = {
        Stage.PREPARE: 0, Stage.VOCAB: 0, Stage.EXPORT: 0, Stage.VERIFY: 0,
        Stage.GENERATE: tp, Stage.EXTRACT: tp, Stage.EVALUATE: tp, Stage.PREDICT: tp,
        Stage.TRAIN: spec.training.gpus,
    }  # fmt: skip
    assert {s: p.gpus for s, p in planned.items()} == wanted
    assert {s for s, p in planned.items() if p.uses_vllm} == {
        Stage.GENERATE,
        Stage.EVALUATE,
        Stage.PREDICT,
    } | ({Stage.EXTRACT} if spec.extraction.backend == "vllm" else set())
    assert {s for s, p in planned.items() if p.retries_oom} == {Stage.GENERATE, Stage.EXTRACT}
    assert planned[Stage.EXTRACT].token_budget == spec.extraction.token_budget
    assert planned[Stage.GENERATE].token_budget == spec.regeneration.token_budget


# --- what the hashes cover -----------------------------------------------------------------------------


@pytest.mark.parametrize("regenerate", [False, True])
def test_learning_rate_changes_train_evaluate_export_only(regenerate: bool) -> None:
    doc = edited(TINY_SPEC, "regeneration", enabled=regenerate)
    after = edited(doc, "training", learningRate=3e-4)
    assert changed(doc, after) == {"train", "evaluate", "export"}


@pytest.mark.parametrize("regenerate", [False, True])
def test_dataset_seed_changes_prepare_and_everything_downstream(regenerate: bool) -> None:
    doc = edited(TINY_SPEC, "regeneration", enabled=regenerate)
    assert changed(doc, edited(doc, "dataset", seed=7)) == TRAINING


@pytest.mark.parametrize(
    ("section", "values", "stages"),
    [
        ("draft", {"vocabSize": 1024}, {"vocab", "train", "evaluate", "export"}),
        ("draft", {"layers": 2}, {"train", "evaluate", "export"}),
        ("extraction", {"dtype": "float16"}, {"extract", "train", "evaluate", "export"}),
        # the tiny example sweeps the speculation length: export copies evaluate's table into its manifest
        ("evaluation", {"prompts": 8}, {"evaluate", "export"}),
        ("evaluation", {"maxTokens": 64}, {"evaluate", "export"}),
        ("verifier", {"revision": "abc"}, TRAINING),
        # generate is skipped (regeneration is off) and nothing reads it, but its hash covers the parameter
        ("regeneration", {"temperature": 0.2}, {"generate"}),
    ],
)
def test_content_parameters_change_their_stage_and_its_downstream(
    section: str, values: dict[str, Any], stages: set[str]
) -> None:
    doc = edited(TINY_SPEC, "regeneration", enabled=False)
    assert changed(doc, edited(doc, section, **values)) == stages


def test_regeneration_parameters_change_generate_and_downstream_when_enabled() -> None:
    doc = edited(TINY_SPEC, "regeneration", enabled=True)
    downstream = TRAINING - {"prepare"}
    for values in ({"temperature": 0.2}, {"maxTokens": 128}, {"reasoning": "drop"}):
        assert changed(doc, edited(doc, "regeneration", **values)) == downstream, values


@pytest.mark.parametrize(
    ("regenerate", "stages"),
    [(False, {"generate", "evaluate", "export"}), (True, TRAINING - {"prepare"})],
)
def test_max_model_len_changes_the_stages_running_the_verifier_in_vllm(
    regenerate: bool, stages: set[str]
) -> None:
    """Export reads train and vocab, and evaluate only for evaluation.sweep's table (the tiny example sweeps;
    without a sweep a new evaluation exports the same draft, tests/contract/test_stage_params.py). (The hash
    of a skipped generate changes too, so that enabling it later runs it with the current parameters.)"""
    doc = edited(TINY_SPEC, "regeneration", enabled=regenerate)
    assert changed(doc, edited(doc, "verifier", maxModelLen=4096)) == stages


def _raise(value: int, low: int, high: int) -> int:
    """A different value in [low, high]."""
    return value + 1 if value < high else max(low, value - 1)


Edit = Callable[[Doc, Doc, st.DrawFn], None]


def _token_budget(doc: Doc, eff: Doc, draw: st.DrawFn) -> None:
    low = eff["dataset"]["maxSequenceLength"]
    value = draw(st.integers(low, 4 * low).filter(lambda v: v != eff["extraction"]["tokenBudget"]))
    doc.setdefault("extraction", {})["tokenBudget"] = value


def _gpu_memory(doc: Doc, eff: Doc, draw: st.DrawFn) -> None:
    value = draw(
        st.sampled_from([0.5, 0.75, 0.95]).filter(lambda v: v != eff["extraction"]["gpuMemoryUtilization"])
    )
    doc.setdefault("extraction", {})["gpuMemoryUtilization"] = value


def _regeneration(doc: Doc, eff: Doc, draw: st.DrawFn) -> None:
    regen = doc.setdefault("regeneration", {})
    regen["concurrency"] = _raise(eff["regeneration"]["concurrency"], 1, 4096)
    regen["tokenBudget"] = eff["regeneration"]["tokenBudget"] * 2


def _gate(doc: Doc, eff: Doc, draw: st.DrawFn) -> None:
    evaluation = doc.setdefault("evaluation", {})
    if "minAcceptanceLength" in evaluation and draw(st.booleans()):
        del evaluation["minAcceptanceLength"]
    else:
        evaluation["minAcceptanceLength"] = draw(st.floats(1.0, 8.0)) + 0.25


def _serving(doc: Doc, eff: Doc, draw: st.DrawFn) -> None:
    serving = doc.setdefault("serving", {})
    serving["replicas"] = _raise(eff["serving"]["replicas"], 0, 1000)
    serving["numSpeculativeTokens"] = _raise(eff["serving"]["numSpeculativeTokens"], 1, 16)
    serving["image"] = "vllm/vllm-openai:nightly"
    serving["extraArgs"] = [*eff["serving"]["extraArgs"][:10], "--enforce-eager"]
    if "pinnedCheckpoint" not in serving:
        serving["enabled"] = not eff["serving"]["enabled"]


def _node_pool(doc: Doc, eff: Doc, draw: st.DrawFn) -> None:
    doc["nodePool"] = {
        "nodeSelector": {"pool": draw(st.sampled_from(["a", "b"]))},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}],
        "affinity": {"podAntiAffinity": {}},
        "gpuResourceName": "amd.com/gpu",
        "gpusPerNode": 64,
    }


def _operations(doc: Doc, eff: Doc, draw: st.DrawFn) -> None:
    doc["suspend"] = not eff["suspend"]
    doc["queueName"] = "other-queue"
    doc["stages"] = {"train": {"backoffLimit": 5, "activeDeadlineSeconds": 60}}


EXECUTION_ONLY: dict[str, Edit] = {
    "extraction.tokenBudget": _token_budget,
    "extraction.gpuMemoryUtilization": _gpu_memory,
    "regeneration.concurrency+tokenBudget": _regeneration,
    "evaluation.minAcceptanceLength": _gate,
    "serving.*": _serving,
    "nodePool.*": _node_pool,
    "suspend, queueName, stages": _operations,
}


@st.composite
def execution_edits(draw: st.DrawFn) -> tuple[Doc, Doc, str]:
    doc = draw(valid_specs())
    after = copy.deepcopy(doc)
    what = draw(st.sampled_from(sorted(EXECUTION_ONLY)))
    EXECUTION_ONLY[what](after, defaulted(doc), draw)
    return doc, after, what


@FAST
@given(execution_edits())
def test_execution_only_parameters_change_no_hash(case: tuple[Doc, Doc, str]) -> None:
    before, after, what = case
    assert hashes(before) == hashes(after), what


@FAST
@given(valid_specs())
def test_hashes_depend_on_the_spec_not_on_how_it_was_written(doc: Doc) -> None:
    """Defaults written out, or keys in another order: the same stages, the same hashes."""
    assert hashes(defaulted(doc)) == hashes(doc)
    assert hashes(dict(reversed(list(doc.items())))) == hashes(doc)


def test_content_hash_is_canonical() -> None:
    assert content_hash({"a": 1, "b": [1, 2]}) == content_hash({"b": [1, 2], "a": 1})
    assert content_hash({"a": 1}) != content_hash({"a": 2})
    assert len(content_hash({})) == HASH_LENGTH


# --- the command line ----------------------------------------------------------------------------------


def test_stage_argv_shape() -> None:
    planned = plans(edited(KIMI_SPEC, "regeneration", enabled=True))
    train = planned["train"]
    assert stage_argv(train, "/etc/run.json", "/artifacts") == [
        "eagle3", "stage", "train", "--spec", "/etc/run.json", "--artifacts", "/artifacts",
        "--output", train.output_dir,
        "--input", f"extract={planned['extract'].output_dir}",
        "--input", f"generate={planned['generate'].output_dir}",
        "--input", f"vocab={planned['vocab'].output_dir}",
    ]  # fmt: skip
    evaluate = stage_argv(planned["evaluate"], "s", "a")
    assert [evaluate[i + 1].split("=")[0] for i, x in enumerate(evaluate) if x == "--input"] == [
        "generate", "train",
    ]  # fmt: skip
    assert "--input" not in stage_argv(planned["prepare"], "s", "a")


@FAST
@given(specs())
def test_inputs_are_sorted_and_only_extract_and_generate_get_a_token_budget(spec: Eagle3RunSpec) -> None:
    for plan in plan_stages(spec):
        argv = stage_argv(plan, "/spec", "/art")
        assert argv[:3] == ["eagle3", "stage", plan.stage.value]
        assert argv[argv.index("--output") + 1] == plan.output_dir
        inputs = [argv[i + 1] for i, x in enumerate(argv) if x == "--input"]
        assert inputs == sorted(f"{k}={v}" for k, v in plan.inputs.items())
        if plan.stage in (Stage.EXTRACT, Stage.GENERATE):
            assert argv[-2:] == ["--token-budget", str(plan.token_budget)]
            assert stage_argv(plan, "/spec", "/art", token_budget=64)[-2:] == ["--token-budget", "64"]
        else:
            assert "--token-budget" not in argv


# --- online extraction and multi-node training ----------------------------------------------------------


def test_online_mode_skips_extract_and_train_reads_no_extract_output() -> None:
    online = edited(minimal(), "extraction", mode="online")
    planned = plans(online)
    assert planned["extract"].skipped is not None and "online" in planned["extract"].skipped
    assert set(planned["train"].inputs) == {"prepare", "vocab"}
    assert "--input" in stage_argv(planned["train"], "/spec/run.json", "/artifacts")
    assert "extract=" not in " ".join(stage_argv(planned["train"], "/spec/run.json", "/artifacts"))


def test_online_changes_train_and_after_but_not_the_stages_before() -> None:
    before, after = hashes(minimal()), hashes(edited(minimal(), "extraction", mode="online"))
    assert {s for s in ALL if before[s] != after[s]} == {"train", "evaluate", "export"}


def test_how_samples_travel_changes_no_hash() -> None:
    online = edited(minimal(), "extraction", mode="online")
    base = hashes(online)
    for values in ({"transfer": "mooncake"}, {"servers": 4}, {"keep": True}):
        assert hashes(edited(online, "extraction", mode="online", **values)) == base, values


def test_defaults_of_the_new_fields_keep_every_earlier_hash() -> None:
    explicit = edited(minimal(), "extraction", mode="offline", transfer="volume", servers=1, keep=False)
    explicit = edited(explicit, "training", nodes=1)
    assert hashes(explicit) == hashes(minimal())
    assert hashes(edited(minimal(), "training", nodes=2))["train"] != hashes(minimal())["train"]
