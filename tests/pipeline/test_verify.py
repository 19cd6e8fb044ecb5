"""`eagle3 stage verify`: the pinned draft's files on the artifacts volume against the sha256 pinned in git.

The checkpoint is laid out as export writes it (config.json, config.py, model.safetensors and manifest.json
from export's own `write_manifest`), without training a draft: verify reads bytes, not tensors.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from eagle3_contract.api.validation import parse_spec
from eagle3_contract.exit_codes import CHECK_FAILED_EXIT_CODE
from eagle3_contract.results import VerifyResult
from eagle3_contract.stages import Stage, plan_stages
from eagle3_operator.reconcile.verification import check_failure
from eagle3_pipeline.data.draft_checkpoint import write_manifest as write_checkpoint_manifest
from eagle3_pipeline.stage_main import run_stage
from tests.pipeline.manifests import write_manifest

pytestmark = pytest.mark.pipeline

DRAFT = "export/3f0c2a9d41be"


# what vLLM reads of an EAGLE-3 draft's config (MethodRow.vllm_reads), stated as speculators writes it
EAGLE3_CONFIG = {
    "speculators_model_type": "eagle3",
    "draft_vocab_size": 4,
    "norm_before_residual": True,
    "norm_before_fc": False,
    "fc_norm": False,
    "norm_output": False,
    "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
}


def export_like(directory: Path) -> str:
    """A small serving checkpoint as export leaves it; returns the weights' sha256."""
    directory.mkdir(parents=True)
    rng = np.random.default_rng(0)
    tensors = {"fc.weight": rng.standard_normal((8, 24)).astype(np.float16), "d2t": np.arange(4)}
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(EAGLE3_CONFIG) + "\n")
    (directory / "config.py").write_text("class Eagle3SpeculatorConfig: ...\n")
    manifest = write_checkpoint_manifest(directory, {"verifier": "/models/tiny-llama"})
    (directory / "result.json").write_text(json.dumps({"sha256": manifest["sha256"]}))  # export's commit
    digest: str = manifest["sha256"]
    return digest


def spec_with_pin(path: str, sha256: str) -> dict[str, Any]:
    return {
        "verifier": {"model": "/models/tiny-llama"},
        "dataset": {"source": "/models/datasets/tiny-chat.jsonl"},
        "serving": {"pinnedCheckpoint": {"path": path, "sha256": sha256}},
    }


class Verify:
    """`eagle3 stage verify` against an artifacts directory, as the verify Job runs it."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp = tmp
        self.artifacts = tmp / "artifacts"
        self.termination = tmp / "termination-log"
        monkeypatch.setenv("EAGLE3_TERMINATION_LOG", str(self.termination))
        self.good = export_like(self.artifacts / DRAFT)

    def run(self, path: str = DRAFT, sha256: str | None = None) -> tuple[int, dict[str, Any], str]:
        spec = spec_with_pin(path, sha256 or self.good)
        manifest = write_manifest(self.tmp / "run.yaml", spec)
        [plan] = [p for p in plan_stages(parse_spec(spec)) if p.stage == Stage.VERIFY]
        self.output = self.artifacts / plan.output_dir
        self.termination.write_text("")
        code = run_stage("verify", str(manifest), str(self.artifacts), plan.output_dir, [])
        return code, json.loads(self.termination.read_text()), plan.output_dir


@pytest.fixture
def verify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Verify:
    return Verify(tmp_path, monkeypatch)


def test_the_pinned_digest_passes_and_names_every_file(verify: Verify) -> None:
    code, result, _ = verify.run()
    assert code == 0
    assert result["sha256"] == verify.good
    assert (
        result["sha256"]
        == hashlib.sha256((verify.artifacts / DRAFT / "model.safetensors").read_bytes()).hexdigest()
    )
    assert sorted(result["files"]) == ["config.json", "config.py", "model.safetensors"]
    listed = json.loads((verify.artifacts / DRAFT / "manifest.json").read_text())
    assert result["bytes"] == listed["bytes"] and result["manifest"] is True
    assert result["path"] == DRAFT


def test_an_absolute_path_under_the_artifacts_mount_is_the_same_draft(verify: Verify) -> None:
    code, result, _ = verify.run(path=f"/artifacts/{DRAFT}")
    assert code == 0 and result["sha256"] == verify.good


def test_another_digest_is_a_checksum_mismatch_naming_both(verify: Verify) -> None:
    pinned = "0" * 64
    code, message, _ = verify.run(sha256=pinned)
    assert code == CHECK_FAILED_EXIT_CODE
    assert message["reason"] == "ChecksumMismatch"
    assert (message["expected"], message["actual"]) == (pinned, verify.good)
    assert message["path"] == DRAFT and message["file"] == "model.safetensors"
    for part in (pinned, verify.good, f"/artifacts/{DRAFT}/model.safetensors", "eagle3 promote"):
        assert part in message["error"], part
    assert message["error"].startswith("/artifacts/"), "the status names the stage itself"
    assert not verify.output.exists(), "a refused draft leaves no verify output"
    reason, status_message = check_failure("tiny-verify-abc", message) or ("", "")
    assert reason == "ChecksumMismatch" and pinned in status_message and verify.good in status_message


def test_the_files_are_read_again_on_every_run(verify: Verify) -> None:
    assert verify.run()[0] == 0
    assert (verify.output / "result.json").is_file()
    weights = verify.artifacts / DRAFT / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"!")  # replaced on the volume after it was verified
    code, message, _ = verify.run()
    assert code == CHECK_FAILED_EXIT_CODE and message["reason"] == "ChecksumMismatch"


def test_a_missing_checkpoint_is_named(verify: Verify) -> None:
    code, message, _ = verify.run(path="export/000000000000")
    assert code == CHECK_FAILED_EXIT_CODE
    assert message["reason"] == "CheckpointMissing"
    assert "no model.safetensors at /artifacts/export/000000000000/model.safetensors" in message["error"]
    assert "storage.artifacts.claimName" in message["error"]


def test_a_file_changed_after_export_fails_against_the_manifest(verify: Verify) -> None:
    (verify.artifacts / DRAFT / "config.json").write_text('{"speculators_model_type": "other"}\n')
    code, message, _ = verify.run()
    assert code == CHECK_FAILED_EXIT_CODE
    assert message["reason"] == "ChecksumMismatch" and message["file"] == "config.json"
    assert "manifest.json" in message["error"]


def test_a_file_listed_in_the_manifest_but_gone_is_missing(verify: Verify) -> None:
    (verify.artifacts / DRAFT / "config.py").unlink()
    code, message, _ = verify.run()
    assert (code, message["reason"], message["file"]) == (
        CHECK_FAILED_EXIT_CODE,
        "CheckpointMissing",
        "config.py",
    )


def test_a_draft_without_a_manifest_is_checked_by_its_weights(verify: Verify) -> None:
    (verify.artifacts / DRAFT / "manifest.json").unlink()
    code, result, _ = verify.run()
    assert code == 0 and result["manifest"] is False and list(result["files"]) == ["model.safetensors"]


@pytest.mark.parametrize("manifest", [True, False], ids=["exported-before", "no-manifest"])
def test_a_config_without_a_field_vllm_reads_is_refused(verify: Verify, manifest: bool) -> None:
    """Issue 31 (speculators #1065, vLLM #54526): vLLM would serve it with its own default for the field. An
    old export's manifest matches its files; a draft from elsewhere has none: refused either way."""
    draft = verify.artifacts / DRAFT
    config = {k: v for k, v in EAGLE3_CONFIG.items() if k != "norm_before_residual"}
    (draft / "config.json").write_text(json.dumps(config) + "\n")
    (draft / "manifest.json").unlink()
    if manifest:
        write_checkpoint_manifest(draft, {"verifier": "/models/tiny-llama"})
    code, message, _ = verify.run()
    assert code == CHECK_FAILED_EXIT_CODE
    assert message["reason"] == "DraftFieldsMissing" and message["missing"] == ["norm_before_residual"]
    assert (
        message["file"] == "config.json" and "vLLM would serve it with its own defaults" in message["error"]
    )
    reason, _ = check_failure("tiny-verify-abc", message) or ("", "")
    assert reason == "DraftFieldsMissing"


def test_the_command_line_exits_with_the_check_failed_code(verify: Verify, tmp_path: Path) -> None:
    """What the Job's container runs: its exit code is the one the Job's podFailurePolicy fails at once."""
    manifest = write_manifest(tmp_path / "cli.yaml", spec_with_pin(DRAFT, "1" * 64))
    argv = ["stage", "verify", "--spec", str(manifest), "--artifacts", str(verify.artifacts)]
    argv += ["--output", "verify/cli"]
    proc = subprocess.run(
        [sys.executable, "-m", "eagle3_cli", *argv], capture_output=True, text=True, check=False
    )
    assert proc.returncode == CHECK_FAILED_EXIT_CODE, proc.stderr
    assert "ChecksumMismatch" not in proc.stderr and "has sha256" in proc.stderr
    assert json.loads(verify.termination.read_text())["reason"] == "ChecksumMismatch"


def test_eagle3_run_verifies_a_pinned_draft_on_every_run(verify: Verify, tmp_path: Path) -> None:
    """The local executor: every stage skipped but verify, which runs each time (never `cached`)."""
    from eagle3_contract.api.manifest import load_manifest
    from eagle3_pipeline.local.run import LocalOptions, LocalRunError, run_local

    manifest = load_manifest(write_manifest(tmp_path / "local.yaml", spec_with_pin(DRAFT, verify.good)))
    options = LocalOptions(artifacts=verify.artifacts)
    for _ in range(2):
        outcomes = {o.stage: o for o in run_local(manifest, options)}
        assert {s for s, o in outcomes.items() if o.status == "skipped"} == set(outcomes) - {"verify"}
        verified = outcomes["verify"].result  # result.json, typed
        assert outcomes["verify"].status == "done"
        assert isinstance(verified, VerifyResult) and verified.sha256 == verify.good
    (verify.artifacts / DRAFT / "model.safetensors").write_bytes(b"not the promoted weights")
    with pytest.raises(LocalRunError, match=f"stage verify failed: exit code {CHECK_FAILED_EXIT_CODE}"):
        run_local(manifest, options)
