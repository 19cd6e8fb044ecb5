"""A later generation's stages (eagle3_contract.generation): content-addressed from the spec, the window and
the serving draft; the first generation's data and vocabulary reused; what its programs read is what was
hashed."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3_contract.api.manifest import load_manifest
from eagle3_contract.api.spec import Eagle3RunSpec, ExportedDraft
from eagle3_contract.generation import (
    Generation,
    generation_manifest,
    generation_number,
    generation_of,
    generation_prepare_params,
    manifest_plans,
    plan_generation,
)
from eagle3_contract.stages import Stage, StagePlan, plan_stages
from tests.tiny_spec import EXAMPLE

SERVING = ExportedDraft(path="export/0123456789ab")
UNTIL = datetime(2027, 1, 2, 3, 4, 5, tzinfo=UTC)


def example() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return document


def spec() -> Eagle3RunSpec:
    return load_manifest(EXAMPLE).spec


def generation(**changes: Any) -> Generation:
    fields: dict[str, Any] = {
        "number": 2,
        "capture": "/artifacts/capture",
        "serving": SERVING,
        "until": UNTIL,
    }
    return Generation(**(fields | changes))


def by_stage(plans: list[StagePlan]) -> dict[Stage, StagePlan]:
    return {plan.stage: plan for plan in plans}


def test_a_generation_reads_the_first_ones_data_keeps_its_vocabulary_and_trains_anew() -> None:
    first, later = by_stage(plan_stages(spec())), by_stage(plan_generation(spec(), generation()))
    prepare = later[Stage.PREPARE]
    assert prepare.hash != first[Stage.PREPARE].hash
    # the tiny example regenerates its answers: the first generation's data is generate's output
    assert prepare.inputs == {"generate": first[Stage.GENERATE].output_dir}, "the first generation's data"
    assert later[Stage.VOCAB] == first[Stage.VOCAB], "the mapping stays: the warm start fits"
    for stage in (Stage.EXTRACT, Stage.TRAIN, Stage.EVALUATE, Stage.EXPORT):
        assert later[stage].skipped is None and later[stage].hash != first[stage].hash, stage
    assert later[Stage.TRAIN].inputs == {
        "prepare": prepare.output_dir,
        "extract": later[Stage.EXTRACT].output_dir,
        "vocab": first[Stage.VOCAB].output_dir,
    }
    assert later[Stage.EXTRACT].inputs == {"prepare": prepare.output_dir}
    assert all(later[s].skipped for s in (Stage.PREDICT, Stage.GENERATE, Stage.VERIFY))


def test_the_same_generation_plans_the_same_stages_and_another_window_others() -> None:
    once, again = plan_generation(spec(), generation()), plan_generation(spec(), generation())
    assert once == again
    later = by_stage(plan_generation(spec(), generation(until=datetime(2027, 1, 3, tzinfo=UTC))))
    assert later[Stage.PREPARE].hash != by_stage(once)[Stage.PREPARE].hash
    assert later[Stage.VOCAB] == by_stage(once)[Stage.VOCAB]
    other_draft = by_stage(
        plan_generation(spec(), generation(serving=ExportedDraft(path="export/fedcba987654")))
    )
    assert other_draft[Stage.PREPARE] == by_stage(once)[Stage.PREPARE], (
        "the data does not depend on the draft"
    )
    assert other_draft[Stage.TRAIN].hash != by_stage(once)[Stage.TRAIN].hash, (
        "a warm start from another draft"
    )


def test_what_the_generations_programs_read_is_what_its_plan_hashed(tmp_path: Path) -> None:
    from eagle3_pipeline.runtime.context import StageContext

    run = generation(after=datetime(2027, 1, 1, tzinfo=UTC), original_ratio=0.5, epochs=2)
    document = generation_manifest(example(), spec(), run)
    path = tmp_path / "generation.yaml"
    path.write_text(yaml.safe_dump(document))
    manifest = load_manifest(path)
    data = generation_of(manifest.document)
    assert data is not None and data.original_ratio == 0.5 and data.after == "2027-01-01T00:00:00.000Z"
    assert generation_of(example()) is None
    t = manifest.spec.training
    assert t.epochs == 2 and t.warm_start is not None and t.warm_start.path == SERVING.path
    assert (
        manifest.spec.evaluation.incumbent is not None
        and manifest.spec.evaluation.incumbent.path == SERVING.path
    )
    planned = plan_generation(spec(), run)
    # the manifest alone plans the same stages: `eagle3 status` and the operator read it as the run did
    assert manifest_plans(manifest.document, manifest.spec) == planned
    assert manifest_plans(example(), spec()) == plan_stages(spec())
    assert generation_number(manifest.document) == 2 and generation_number(example()) is None
    ctx = StageContext.of_spec(
        Stage.PREPARE, "tiny", manifest.spec, tmp_path, tmp_path / "out", generation=data
    )
    assert ctx.params == generation_prepare_params(spec(), run.data())


def test_a_run_that_prepares_nothing_has_no_data_to_mix() -> None:
    pinned = spec().model_copy(
        update={"serving": spec().serving.model_copy(update={"pinned_checkpoint": {"path": "export/x"}})}
    )
    pinned = Eagle3RunSpec.model_validate(pinned.model_dump())
    with pytest.raises(ValueError, match="prepares none"):
        plan_generation(pinned, generation())


def test_an_annotation_this_version_did_not_write_is_named() -> None:
    document = example()
    document["metadata"]["annotations"] = {"eagle3.dev/generation": '{"number": 2}'}
    with pytest.raises(ValueError, match="not a generation this version wrote"):
        generation_of(document)
