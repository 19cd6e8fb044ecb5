"""The typed stage parameters (eagle3_contract.params): what a stage's hash covers is what its program reads.

Every leaf field of the tiny example's spec (and of variants where generate and verify run) is edited to
another valid value, and for every stage: its hash changes exactly when its params (or an input's hash)
change, and an edit that only touches its tuning never changes it. The fields that reach no stage at all,
and those that reach only tuning, are listed here, so moving a field between the two halves is a reviewed
change of this file.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3_contract.api.manifest import load_manifest
from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.params import StageParams, StageTuning
from eagle3_contract.stages import (
    DEFINITIONS,
    STAGE_FORMAT_VERSION,
    Stage,
    StagePlan,
    content_hash,
    plan_stages,
)
from eagle3_pipeline import stages as programs
from eagle3_pipeline.runtime.context import DATA_STAGES, StageContext
from eagle3_pipeline.stage_main import build_context

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny" / "eagle3run.yaml"
Doc = dict[str, Any]
Path_ = tuple[str, ...]

PIN = {"path": "export/0123456789ab", "sha256": "ab" * 32}


def example() -> Doc:
    """The example's spec with every default written out: every field is a leaf to edit."""
    spec = load_manifest(EXAMPLE).spec
    dumped: Doc = spec.model_dump(mode="json", by_alias=True)
    return dumped


def variants() -> dict[str, Doc]:
    base = example()
    # draft.candidates with a training-free rival: train trains draft.method alone, evaluate's bake-off adds
    bake_off = copy.deepcopy(base)
    bake_off["draft"]["candidates"] = ["eagle3", "ngram"]
    bake_off["evaluation"]["predict"] = False
    off = copy.deepcopy(base)
    off["regeneration"]["enabled"] = False
    pinned = copy.deepcopy(base)
    pinned["serving"]["pinnedCheckpoint"] = dict(PIN)
    online = copy.deepcopy(base)
    online["extraction"]["mode"] = "online"
    # without evaluation.sweep (the example sets one), evaluation.concurrencies is read by no stage (nor by a
    # prediction: predict is off here); with it, evaluate hashes the sweep and the concurrencies
    no_sweep = copy.deepcopy(base)
    no_sweep["evaluation"]["sweep"] = None
    no_sweep["evaluation"]["predict"] = False
    no_sweep["serving"]["speculationLength"] = "fixed"  # tuned needs the sweep's table
    # evaluation.predict: the predict stage hashes the verifier, the draft's shape, k, maxTokens, the
    # concurrencies and targetAcceptanceLength (off, it hashes none of them)
    predict = copy.deepcopy(base)
    predict["evaluation"]["predict"] = True
    # training.checkpointSelection acceptance: evaluate hashes checkpointsToEvaluate (by validation loss it
    # hashes neither), export takes evaluate's choice
    acceptance = copy.deepcopy(base)
    acceptance["training"]["checkpointSelection"] = "acceptance"
    # draft.method dflash: train hashes its block size (eagle3 and peagle have none: a rule refuses one)
    dflash = copy.deepcopy(base)
    dflash["draft"]["method"] = "dflash"
    dflash["evaluation"]["predict"] = False
    # draft.candidates: train hashes them; export takes evaluate's choice
    candidates = copy.deepcopy(base)
    candidates["draft"]["candidates"] = ["eagle3", "peagle"]
    candidates["evaluation"]["predict"] = False
    return {
        "bake-off": bake_off,
        "candidates": candidates,
        "acceptance": acceptance,
        "dflash": dflash,
        "example": base,
        "no-regeneration": off,
        "pinned": pinned,
        "online": online,
        "no-sweep": no_sweep,
        "predict": predict,
    }


# --- editing a leaf -----------------------------------------------------------------------------------------

ENUMS = {
    "format": ["auto", "sharegpt", "messages", "prompts"],
    "reasoning": ["keep", "drop"],
    "backend": ["vllm", "transformers"],
    "dtype": ["bfloat16", "float16", "fp8"],
    "scheduler": ["linear", "cosine", "constant"],
    "mode": ["offline", "online"],
    "transfer": ["volume", "mooncake"],
    "accessModes": [["ReadWriteOnce"], ["ReadWriteMany"]],
    "sha256": ["ab" * 32, "cd" * 32],
    "device": ["gpu", "cpu"],
    "promotion": ["automatic", "reviewed"],
    "speculationLength": ["fixed", "tuned"],
    "method": ["eagle3", "peagle", "dflash"],
    "checkpointSelection": ["valLoss", "acceptance"],
}
# What an unset (None) field is set to; a section that is unset gets a small valid one.
UNSET = {
    "revision": "abc123",
    "maxModelLen": 2048,
    "maxSamples": 50,
    "blockSize": 4,
    "candidates": ["eagle3", "peagle"],
    "layers": [1, 2],
    "minAcceptanceLength": 2.0,
    "image": "vllm/vllm-openai:nightly",
    "pinnedCheckpoint": {"path": "export/ffffffffffff"},
    "warmStart": {"path": "export/eeeeeeeeeeee"},
    "incumbent": {"path": "export/dddddddddddd"},
    "claimName": "other-claim",
    "storageClassName": "fast",
    "pipeline": "registry.example/pipeline:1",
    "vllm": "registry.example/vllm:1",
    "hfTokenSecret": {"name": "hf-token"},
    "queueName": "other-queue",
    "sampling": {"temperature": 0.7, "topP": 0.95},
    "targetAcceptanceLength": 2.5,
    "sweep": {"numSpeculativeTokens": [2, 4]},
    "prompts": 16,  # evaluation.sweep.prompts
    "categories": ["add", "count"],  # evaluation.categories
    "canary": {"replicas": 2, "duration": "5m"},  # serving.canary (the operator's only)
    "capture": {"sampleRate": 0.5},  # serving.capture (the operator's only)
    "resources": {"requests": {"cpu": "8"}},
    "serviceAccountName": "runner",
    "priorityClassName": "high",
    "securityContext": {"runAsUser": 1000},
    "containerSecurityContext": {"readOnlyRootFilesystem": True},
}
MAPS = {
    "nodeSelector": {"pool": "a"},
    "affinity": {"podAntiAffinity": {}},
    "requests": {"cpu": "1"},
    "labels": {"team": "ml"},
    "annotations": {"note": "x"},
    "podMonitorLabels": {"release": "kps"},
}
LISTS = {
    "tolerations": [{"key": "gpu", "operator": "Exists"}],
    "imagePullSecrets": [{"name": "regcred"}],
    "env": [{"name": "EXTRA", "value": "1"}],
    "candidates": ["eagle3", "dflash"],
}


def leaves(doc: Any, path: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    """Every leaf: a scalar, a list, a None, or an empty map."""
    if isinstance(doc, dict) and doc:
        for key, value in doc.items():
            yield from leaves(value, (*path, key))
    else:
        yield path, doc


def candidates(path: Path_, value: Any) -> list[Any]:
    key = path[-1]
    if key in ENUMS:
        return [v for v in ENUMS[key] if v != value]
    if value is None:
        if len(path) == 2 and path[0] == "stages":
            return [{"backoffLimit": 1}]
        return [UNSET[key]]
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value * 2, value - 1]
    if isinstance(value, float):
        return [round(value / 2, 6) or 0.5, round(value * 1.5, 6), value + 0.1]
    if isinstance(value, str):
        return ["6Gi"] if key == "size" else [value + "x"]
    if isinstance(value, list):
        if key in LISTS:
            return [LISTS[key]]
        return [value[:-1]] if value and isinstance(value[0], int) else [[*value, "--enforce-eager"]]
    return [MAPS[key]]


def put(doc: Doc, path: Path_, value: Any) -> Doc:
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def edit(doc: Doc, path: Path_) -> Eagle3RunSpec:
    """`doc` with the leaf at `path` set to the first valid other value."""
    value = leaf_at(doc, path)
    errors = []
    for candidate in candidates(path, value):
        try:
            return Eagle3RunSpec.model_validate(put(doc, path, candidate))
        except ValueError as exc:
            errors.append(str(exc).splitlines()[0])
    raise AssertionError(f"no valid other value for {'.'.join(path)} = {value!r}: {errors}")


def leaf_at(doc: Doc, path: Path_) -> Any:
    node: Any = doc
    for key in path:
        node = node[key]
    return node


def plans(spec: Eagle3RunSpec) -> dict[Stage, StagePlan]:
    return {p.stage: p for p in plan_stages(spec)}


def upstream_hashes(spec: Eagle3RunSpec, planned: dict[Stage, StagePlan], stage: Stage) -> dict[Stage, str]:
    return {up: planned[up].hash for up in DEFINITIONS[stage].upstream(spec)}


def reach(before: Eagle3RunSpec, after: Eagle3RunSpec) -> tuple[set[Stage], set[Stage]]:
    """(stages whose params changed, stages whose tuning changed); asserts the hash rule on the way."""
    old, new = plans(before), plans(after)
    params, tuning = set(), set()
    for stage, d in DEFINITIONS.items():
        params_changed = d.params(before) != d.params(after)
        inputs_changed = upstream_hashes(before, old, stage) != upstream_hashes(after, new, stage)
        hash_changed = old[stage].hash != new[stage].hash
        assert hash_changed == (params_changed or inputs_changed), stage
        if params_changed:
            params.add(stage)
        if d.tuning(before) != d.tuning(after):
            tuning.add(stage)
            if not params_changed and not inputs_changed:
                assert not hash_changed, f"a tuning edit changed the hash of {stage}"
    return params, tuning


def dotted(path: Path_) -> str:
    return ".".join(path)


# Fields that no stage reads: execution and serving settings, the gate (judged from evaluate's result).
NO_STAGE = {
    "verifier": set(),
    "regeneration": set(),
    "evaluation": {"minAcceptanceLength"},
    "serving": {
        "enabled",
        "replicas",
        "numSpeculativeTokens",
        "image",
        "extraArgs",
        "promotion",
        "resources",
        "disruptionBudget",
        "canary",
        "capture",
        "speculationLength",
    },
}
EXECUTION_SECTIONS = (
    "nodePool",
    "storage",
    "images",
    "hfTokenSecret",
    "suspend",
    "queueName",
    "stages",
    "pod",
    "monitoring",
)
# Fields stages read as tuning only: they change how a stage runs, never what a successful run writes.
TUNING_ONLY = {
    "verifier.tensorParallelSize": {Stage.PREDICT, Stage.GENERATE, Stage.EXTRACT, Stage.EVALUATE},
    "regeneration.enabled": {Stage.PREPARE},  # generate runs or not (its skip), prepare accepts prompts
    "dataset.maxSkippedFraction": {Stage.PREPARE},  # prepare accepts or refuses the rows read
    "regeneration.concurrency": {Stage.GENERATE},
    "regeneration.tokenBudget": {Stage.GENERATE},
    "extraction.tokenBudget": {Stage.EXTRACT},
    "extraction.gpuMemoryUtilization": {Stage.EXTRACT},
    "extraction.backend": {Stage.EXTRACT},
    # online only: how the samples travel, over how many producers, and whether the trainer keeps a copy
    "extraction.transfer": {Stage.TRAIN},
    "extraction.servers": {Stage.TRAIN},
    "extraction.keep": {Stage.TRAIN},
    # cpu: training.gpus CPU processes instead of GPUs (the world size, hashed, is the same); the other stages
    # do not read it (vLLM's CPU build finds its platform itself; the Jobs request no GPUs)
    "nodePool.device": {Stage.TRAIN},
}


# Leaves a cross-field rule fixes in a variant (a pinned draft needs serving.enabled; speculationLength tuned
# needs evaluation.sweep or a pin).
ALL = ("example", "no-regeneration", "pinned", "online", "no-sweep", "predict", "acceptance", "dflash")
ALL += ("candidates", "bake-off")
FIXED = (
    {
        ("pinned", "serving.enabled"),
        ("no-sweep", "serving.speculationLength"),
        ("predict", "draft.method"),  # a prediction is of EAGLE-3 drafts
        ("dflash", "evaluation.predict"),  # likewise
        ("candidates", "evaluation.predict"),  # likewise
        ("candidates", "draft.method"),  # among the candidates
        ("candidates", "training.nodes"),  # candidates: one node, offline, the best by validation loss
        ("candidates", "extraction.mode"),
        ("candidates", "training.checkpointSelection"),
        ("bake-off", "evaluation.predict"),  # a prediction is of runs without candidates
        ("bake-off", "draft.method"),  # among the candidates
        ("bake-off", "training.checkpointSelection"),  # the best by validation loss
    }
    | {(v, "draft.blockSize") for v in ALL if v != "dflash"}  # DFlash's only
    # candidates are refused with a prediction, online, by acceptance, and without draft.method among them
    | {(v, "draft.candidates") for v in ("predict", "online", "acceptance", "dflash")}
    # online-only fields keep their defaults offline
    | {(v, f"extraction.{f}") for v in ALL if v != "online" for f in ("transfer", "servers", "keep")}
)


# Leaves no stage reads in a variant only: evaluation.concurrencies without a sweep.
UNREAD_IN = (
    {("no-sweep", "evaluation.concurrencies")}
    # read where a speed decides something: the sweep, draft.candidates
    | {("no-sweep", "evaluation.rounds")}
    # only the predict stage reads it, when predict is on
    | {(v, "evaluation.targetAcceptanceLength") for v in ALL if v != "predict"}
    # read with checkpointSelection acceptance only
    | {(v, "training.checkpointsToEvaluate") for v in ALL if v != "acceptance"}
)


def reads_nothing(path: Path_) -> bool:
    return (
        path[0] in EXECUTION_SECTIONS
        or (len(path) > 1 and path[1] in NO_STAGE.get(path[0], set()))
        or path[:2]
        == (
            "serving",
            "pinnedCheckpoint",
        )
    )


@pytest.mark.parametrize("variant", sorted(variants()))
def test_every_leaf_edit_changes_a_hash_exactly_when_params_change(variant: str) -> None:
    doc = variants()[variant]
    before = Eagle3RunSpec.model_validate(doc)
    edited = 0
    for path, _ in leaves(doc):
        if (variant, dotted(path)) in FIXED:
            continue
        after = edit(doc, path)
        params, tuning = reach(before, after)
        where = f"{variant}: {dotted(path)}"
        if dotted(path) in TUNING_ONLY:
            assert params == set() and tuning == TUNING_ONLY[dotted(path)], where
        elif reads_nothing(path) or (variant, dotted(path)) in UNREAD_IN:
            if path[:2] != ("serving", "pinnedCheckpoint"):  # the pin is verify's param
                assert params == tuning == set(), where
        else:
            assert params, f"{where} reaches no stage's params: hash it, or list it as tuning or unread here"
        edited += 1
    assert edited > 60  # every section's fields, not a few


# --- the README's promises, on the example ----------------------------------------------------------------


def changed_stages(doc: Doc, path: Path_, value: Any) -> set[str]:
    old = plans(Eagle3RunSpec.model_validate(doc))
    new = plans(Eagle3RunSpec.model_validate(put(doc, path, value)))
    return {s.value for s in Stage if old[s].hash != new[s].hash}


def test_the_readme_edits() -> None:
    doc = example()
    assert changed_stages(doc, ("training", "learningRate"), 3e-4) == {"train", "evaluate", "export"}
    assert changed_stages(doc, ("extraction", "tokenBudget"), 8192) == set()
    assert "generate" not in changed_stages(doc, ("regeneration", "concurrency"), 4)
    assert changed_stages(doc, ("evaluation", "minAcceptanceLength"), 2.5) == set()


def test_the_sweep_reruns_evaluate_and_export_and_without_it_concurrencies_rerun_nothing() -> None:
    doc = example()
    assert doc["evaluation"]["sweep"] is not None  # the example sweeps: export copies evaluate's table
    assert changed_stages(doc, ("evaluation", "sweep", "numSpeculativeTokens"), [1, 2]) == {
        "evaluate",
        "export",
    }
    assert changed_stages(doc, ("evaluation", "concurrencies"), [1, 8]) >= {"evaluate", "export"}
    no_sweep = variants()["no-sweep"]
    assert changed_stages(no_sweep, ("evaluation", "concurrencies"), [1, 8]) == set()
    export = plans(Eagle3RunSpec.model_validate(no_sweep))[Stage.EXPORT]
    assert set(export.inputs) == {"train", "vocab"}  # no sweep: export's hash is as before the sweep existed


def test_the_hash_payload_is_the_params_model() -> None:
    spec = load_manifest(EXAMPLE).spec
    planned = plans(spec)
    for stage, d in DEFINITIONS.items():
        params = d.params(spec)
        assert isinstance(params, StageParams) and isinstance(d.tuning(spec), StageTuning)
        assert params.model_config.get("frozen") is True
        payload = {
            "stage": stage.value,
            "format": STAGE_FORMAT_VERSION,
            "params": params.model_dump(mode="json", by_alias=True),
            "inputs": {up.value: planned[up].hash for up in d.upstream(spec)},
        }
        assert planned[stage].hash == content_hash(payload)
    assert STAGE_FORMAT_VERSION == 2


# --- the programs ----------------------------------------------------------------------------------------


def test_a_stage_context_has_params_and_tuning_and_no_spec(tmp_path: Path) -> None:
    assert "spec" not in {f.name for f in dataclasses.fields(StageContext)}
    doc = yaml.safe_load(EXAMPLE.read_text())
    manifest = tmp_path / "run.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    spec = load_manifest(manifest).spec
    for stage, plan in plans(spec).items():
        inputs = [f"{k}={v}" for k, v in plan.inputs.items()]
        ctx = build_context(stage.value, str(manifest), str(tmp_path), plan.output_dir, inputs, None)
        assert not hasattr(ctx, "spec")
        assert ctx.stage is stage and set(ctx.inputs) == set(DEFINITIONS[stage].upstream(spec))
        assert ctx.params == DEFINITIONS[stage].params(spec)
        assert ctx.tuning == DEFINITIONS[stage].tuning(spec)
    assert DATA_STAGES == (Stage.GENERATE, Stage.PREPARE)


def test_an_input_that_names_no_stage_is_refused(tmp_path: Path) -> None:
    from eagle3_pipeline.runtime.errors import StageError

    manifest = tmp_path / "run.yaml"
    manifest.write_text(EXAMPLE.read_text())
    with pytest.raises(StageError, match=r"--input 'prepared=x': prepared is not a stage"):
        build_context("vocab", str(manifest), str(tmp_path), "vocab/h", ["prepared=x"], None)


def run_annotation(stage: Stage) -> tuple[str, str]:
    """(params, tuning) class names in the program's `run(ctx: ...)` annotation, read from its source (the
    modules import torch)."""
    source = (Path(inspect.getfile(programs)).parent / stage.value / "program.py").read_text()
    tree = ast.parse(source)
    aliases = {
        node.targets[0].id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
    }
    run = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run")
    annotation = run.args.args[0].annotation
    if isinstance(annotation, ast.Name):
        annotation = aliases[annotation.id]
    assert isinstance(annotation, ast.Subscript) and isinstance(annotation.slice, ast.Tuple), stage
    params, tuning = annotation.slice.elts
    assert isinstance(params, ast.Name) and isinstance(tuning, ast.Name)
    return params.id, tuning.id


@pytest.mark.parametrize("stage", list(Stage))
def test_each_program_is_typed_with_its_stages_params_and_tuning(stage: Stage) -> None:
    spec = load_manifest(EXAMPLE).spec
    d = DEFINITIONS[stage]
    assert run_annotation(stage) == (type(d.params(spec)).__name__, type(d.tuning(spec)).__name__)


def test_draft_method_eagle3_keeps_every_hash_and_peagle_changes_train_onward() -> None:
    """Issue 31: manifests written before draft.method (eagle3, its default) keep their stage hashes; P-EAGLE
    trains another draft from the same prepared data, hidden states and vocabulary."""
    base = example()
    explicit = put(base, ("draft", "method"), "eagle3")
    peagle = put(base, ("draft", "method"), "peagle")
    before = plans(Eagle3RunSpec.model_validate(base))
    assert {s: p.hash for s, p in plans(Eagle3RunSpec.model_validate(explicit)).items()} == {
        s: p.hash for s, p in before.items()
    }
    after = plans(Eagle3RunSpec.model_validate(peagle))
    changed = {s.value for s in before if before[s].hash != after[s].hash}
    assert changed == {"train", "evaluate", "export"}, changed
