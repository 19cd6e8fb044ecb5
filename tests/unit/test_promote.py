"""`eagle3 promote`: from a run as `kubectl get e3r RUN -o yaml` prints it to the change a user commits.

The runs are plain data: the planner's own status after the run exported (tests/unit/reconcile/planner_world),
in the object the API server returns (server-set metadata, CRD defaults written into the spec).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3_cli.main import main
from eagle3_contract.api.validation import parse_spec, spec_document
from eagle3_operator.promote import (
    LAST_APPLIED,
    PromotionError,
    build_promotion,
    commit_message,
    pinned_values,
    promotion_candidate,
    render,
    select_run,
)
from tests.harness.results import fake_result
from tests.unit.reconcile.planner_world import World, tiny

SHA = "cd" * 32
NAMESPACE = "ml"


def exported_world(**sections: Any) -> World:
    """A tiny run with a gate that trained, passed the gate and exported (its Deployment not ready yet)."""
    world = World(tiny(evaluation={"minAcceptanceLength": 1.5}, **sections))
    world.run_to("evaluate")
    world.succeed("evaluate", fake_result("evaluate", acceptance_length=2.25, acceptance_rate=0.4167))
    world.step()
    world.succeed("export", fake_result("export", sha256=SHA, bytes=3 * (1 << 20)))
    world.step()
    return world


def as_served(world: World, applied: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run as the API server returns it: defaults in the spec, server and tool metadata, status."""
    written = {"apiVersion": "eagle3.dev/v1alpha1", "kind": "Eagle3Run", "metadata": {"name": world.ref.name}}
    annotations = {
        "argocd.argoproj.io/tracking-id": "llm:eagle3.dev/Eagle3Run:ml/tiny",
        "team.example.com/owner": "inference",
    }
    if applied is not None:
        annotations[LAST_APPLIED] = json.dumps(written | {"spec": applied})
    return {
        "apiVersion": "eagle3.dev/v1alpha1",
        "kind": "Eagle3Run",
        "metadata": {
            "name": world.ref.name,
            "namespace": NAMESPACE,
            "uid": world.ref.uid,
            "generation": world.generation,
            "resourceVersion": "4711",
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "managedFields": [{"manager": "kubectl", "operation": "Update"}],
            "labels": {"app": "llama", "kustomize.toolkit.fluxcd.io/name": "eagle3"},
            "annotations": annotations,
        },
        "spec": spec_document(parse_spec(world.spec)),
        "status": copy.deepcopy(world.status),
    }


@pytest.fixture
def run() -> dict[str, Any]:
    world = exported_world()
    return as_served(world, applied=copy.deepcopy(world.spec))


def with_pin(spec: dict[str, Any], path: str) -> dict[str, Any]:
    out = copy.deepcopy(spec)
    out.setdefault("serving", {})["pinnedCheckpoint"] = {"path": path, "sha256": SHA}
    return out


# --- the manifest --------------------------------------------------------------------------------------


def test_the_manifest_is_the_written_spec_with_the_pin_and_nothing_else(run: dict[str, Any]) -> None:
    checkpoint = run["status"]["checkpoint"]
    manifest = build_promotion(run)
    applied = json.loads(run["metadata"]["annotations"][LAST_APPLIED])["spec"]
    assert manifest["spec"] == with_pin(applied, checkpoint["path"])
    assert list(manifest) == ["apiVersion", "kind", "metadata", "spec"], "no status"
    assert manifest["metadata"] == {
        "name": "tiny",
        "namespace": NAMESPACE,
        "labels": {"app": "llama"},
        "annotations": {"team.example.com/owner": "inference"},
    }  # no uid, generation, resourceVersion, managedFields, nor what kubectl, Argo CD and Flux write
    assert manifest["apiVersion"] == "eagle3.dev/v1alpha1" and manifest["kind"] == "Eagle3Run"
    assert checkpoint["path"].startswith("export/") and checkpoint["sha256"] == SHA


def test_without_a_last_applied_spec_the_server_defaults_are_left_out(run: dict[str, Any]) -> None:
    del run["metadata"]["annotations"][LAST_APPLIED]  # applied server-side (Flux), or created by a client
    manifest = build_promotion(run)
    pinned = with_pin(run["spec"], run["status"]["checkpoint"]["path"])
    assert parse_spec(manifest["spec"]) == parse_spec(pinned), "the same spec"
    assert manifest["spec"].get("nodePool") == tiny().get("nodePool"), "defaults are not written"
    assert "images" not in manifest["spec"] and "pod" not in manifest["spec"], "defaults are not written"
    assert manifest["spec"]["verifier"] == tiny()["verifier"], "as written, no defaults"


def test_a_last_applied_spec_that_is_not_the_live_one_is_not_used(run: dict[str, Any]) -> None:
    stale = json.loads(run["metadata"]["annotations"][LAST_APPLIED])
    stale["spec"]["serving"] = {"replicas": 9}  # someone patched the live object since
    run["metadata"]["annotations"][LAST_APPLIED] = json.dumps(stale)
    assert build_promotion(run)["spec"]["serving"].get("replicas") != 9


def test_a_training_only_run_is_promoted_to_serve(run: dict[str, Any]) -> None:
    world = exported_world(serving={"enabled": False})
    served = as_served(world, applied=copy.deepcopy(world.spec))
    manifest = build_promotion(served)
    assert "enabled" not in manifest["spec"]["serving"], "a pinned run only serves (a CEL rule)"
    assert parse_spec(manifest["spec"]).serving.enabled


def test_the_pinned_manifest_plans_a_verify_job_first(run: dict[str, Any]) -> None:
    from eagle3_operator.builders.names import RunRef
    from eagle3_operator.reconcile.observe import Observed
    from eagle3_operator.reconcile.planner import plan_run

    manifest = build_promotion(run)
    plan = plan_run(
        RunRef("tiny", NAMESPACE, "u"), 1, manifest["spec"], None, Observed(), "2025-01-01T00:00:00Z"
    )
    jobs = [a.body["metadata"]["labels"]["eagle3.dev/stage"] for a in plan.actions if a.body["kind"] == "Job"]
    assert jobs == ["verify"]


# --- values --------------------------------------------------------------------------------------------


def test_values_hold_only_the_pin_under_the_key(run: dict[str, Any]) -> None:
    path = run["status"]["checkpoint"]["path"]
    pin = {"pinnedCheckpoint": {"path": path, "sha256": SHA}}
    assert build_promotion(run, "values") == {"spec": {"serving": pin}}
    assert build_promotion(run, "values", "runs.tiny.spec") == {"runs": {"tiny": {"spec": {"serving": pin}}}}
    assert build_promotion(run, "values", "") == {"serving": pin}


def test_values_are_refused_like_the_manifest(run: dict[str, Any]) -> None:
    run["status"]["conditions"] = [c for c in run["status"]["conditions"] if c["type"] != "GatePassed"]
    with pytest.raises(PromotionError, match="has not passed yet"):
        build_promotion(run, "values")


# --- refusals ------------------------------------------------------------------------------------------


def test_a_run_below_its_gate_is_refused() -> None:
    world = World(tiny(evaluation={"minAcceptanceLength": 2.0}))
    world.run_to("evaluate")
    world.succeed("evaluate", {"acceptanceLength": 1.6})
    world.step()
    with pytest.raises(PromotionError) as refused:
        build_promotion(as_served(world))
    message = str(refused.value)
    assert "ml/tiny did not pass its evaluation gate (AcceptanceBelowGate" in message
    assert "1.600 is below evaluation.minAcceptanceLength 2.0" in message and "must not serve" in message


def test_a_run_that_has_not_exported_is_refused() -> None:
    world = World(tiny())
    world.run_to("train")
    with pytest.raises(PromotionError, match=r"has no exported checkpoint .*stage export: Pending"):
        build_promotion(as_served(world))


def test_a_run_retraining_after_an_edit_is_refused(run: dict[str, Any]) -> None:
    run["metadata"]["generation"] = 2  # edited; the operator has not reconciled it yet
    with pytest.raises(PromotionError, match="status is of spec generation 1, its spec is at generation 2"):
        build_promotion(run)


def test_a_checkpoint_of_an_earlier_spec_is_refused() -> None:
    world = World(tiny())  # no gate: the export is what tells
    world.run_to("none")
    world.edit(training={"learningRate": 0.002})
    world.run_to("train")  # the old export still serves and is still status.checkpoint
    served = as_served(world)
    assert served["status"]["checkpoint"]["path"] != served["status"]["stages"]["export"].get("outputDir")
    with pytest.raises(PromotionError, match="is not the export of its current spec"):
        build_promotion(served)


def test_a_pinned_run_is_refused() -> None:
    world = World(tiny(serving={"pinnedCheckpoint": {"path": "export/abc", "sha256": SHA}}))
    world.step()
    with pytest.raises(PromotionError, match=r"already serves a pinned draft \(export/abc\)"):
        build_promotion(as_served(world))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.pop("status"), "has no status yet"),
        (lambda r: r.update(kind="Deployment"), "a Deployment, not an Eagle3Run"),
        (lambda r: r["spec"].update(training={"gpus": 99}), "spec.training.gpus"),
        (lambda r: r["status"]["checkpoint"].pop("sha256"), "has no sha256"),
    ],
    ids=["no-status", "wrong-kind", "invalid-spec", "no-sha256"],
)
def test_what_cannot_be_promoted_says_why(run: dict[str, Any], change: Any, message: str) -> None:
    change(run)
    with pytest.raises(PromotionError, match=message):
        build_promotion(run)


# --- the commit message and the file -------------------------------------------------------------------


def test_the_commit_message_names_the_draft_and_its_acceptance(run: dict[str, Any]) -> None:
    message = commit_message(promotion_candidate(run))
    subject, blank, *body = message.splitlines()
    assert subject == "eagle3: serve the draft of ml/tiny (mean acceptance length 2.250)" and blank == ""
    text = "\n".join(body)
    for part in (
        run["status"]["checkpoint"]["path"],
        SHA,
        "3.0 MiB",
        "acceptance rate 0.417",
        "minAcceptanceLength 1.5",
        "3 speculative tokens",
        "generation 1",
        "verifies the sha256",
    ):
        assert part in text, part  # fmt: skip


def test_figures_come_from_evaluate_when_the_status_predates_them(run: dict[str, Any]) -> None:
    for key in ("acceptanceLength", "acceptanceRate"):
        del run["status"]["checkpoint"][key]
    checkpoint = promotion_candidate(run).checkpoint
    assert (checkpoint.acceptance_length, checkpoint.acceptance_rate) == (2.25, 0.4167)


def test_the_rendered_file_is_yaml_with_a_provenance_comment(run: dict[str, Any]) -> None:
    text = render(build_promotion(run), promotion_candidate(run))
    assert text.startswith("# Promoted with `eagle3 promote` from Eagle3Run ml/tiny: mean acceptance length")
    assert yaml.safe_load(text) == build_promotion(run)
    assert pinned_values(promotion_candidate(run).checkpoint, "") == yaml.safe_load(
        render(build_promotion(run, "values", ""), promotion_candidate(run))
    )


def test_a_run_is_picked_by_name_from_a_list(run: dict[str, Any]) -> None:
    other = copy.deepcopy(run) | {"metadata": {"name": "other"}}
    assert select_run([{"kind": "List", "items": [other, run]}], "tiny") is run
    assert select_run([other, run], "tiny") is run
    with pytest.raises(
        PromotionError, match=r"no Eagle3Run named 'nope' in the file \(it holds \['other', 'tiny'\]"
    ):
        select_run([other, run], "nope")


# --- the command line ----------------------------------------------------------------------------------


def test_the_cli_writes_the_manifest_to_stdout_and_suggests_the_commit(
    run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "tiny.yaml"
    source.write_text(yaml.safe_dump(run))
    assert main(["promote", "tiny", "--from-file", str(source)]) == 0
    out, err = capsys.readouterr()
    assert yaml.safe_load(out) == build_promotion(run)
    assert "git add <the file you saved it to>" in err and "git commit -F- <<'EOF'" in err
    assert "\neagle3: serve the draft of ml/tiny (mean acceptance length 2.250)\n" in err and err.endswith(
        "EOF\n"
    )


def test_the_cli_writes_values_to_a_file(
    run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, target = tmp_path / "tiny.json", tmp_path / "values-pinned.yaml"
    source.write_text(json.dumps(run))  # `kubectl get -o json` reads as well
    argv = ["promote", "tiny", "--from-file", str(source), "--format", "values", "-o", str(target)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert yaml.safe_load(target.read_text()) == build_promotion(run, "values")
    assert f"git add {target}" in err


def test_the_cli_reads_stdin(
    run: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(yaml.safe_dump(run)))
    assert main(["promote", "tiny", "--from-file", "-", "--format", "values", "--values-key", ""]) == 0
    assert "pinnedCheckpoint" in yaml.safe_load(capsys.readouterr().out)["serving"]


def test_the_cli_refuses_with_the_reason_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    world = World(tiny())
    world.run_to("train")
    source, target = tmp_path / "tiny.yaml", tmp_path / "out.yaml"
    source.write_text(yaml.safe_dump(as_served(world)))
    assert main(["promote", "tiny", "--from-file", str(source), "-o", str(target)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and not target.exists()
    assert err.startswith("error: Eagle3Run ml/tiny has no exported checkpoint")


def test_the_cli_says_what_is_wrong_with_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["promote", "tiny", "--from-file", str(tmp_path / "absent.yaml")]) == 1
    assert "absent.yaml: no such file" in capsys.readouterr().err
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: [unclosed\n")
    assert main(["promote", "tiny", "--from-file", str(broken)]) == 1
    assert "broken.yaml: not valid YAML/JSON" in capsys.readouterr().err


def test_a_binary_file_is_refused_as_not_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--from-file` on a binary file used to end in a UnicodeDecodeError traceback."""
    binary = tmp_path / "model.safetensors"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x00" * 8)
    assert main(["promote", "tiny", "--from-file", str(binary)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "model.safetensors" in err
    assert "not UTF-8 text" in err and "kubectl get e3r tiny -o yaml" in err
