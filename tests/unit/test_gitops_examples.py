"""examples/gitops: Argo CD and Flux apply the kustomize directory holding the pinned serving run.

Every file parses; each Eagle3Run in them validates against the spec model and pins a draft with a sha256
(so the operator verifies it before vLLM rolls); the GitOps objects point at what is there. (test_examples.py
checks every example, these included, against the CRD schema and its CEL rules.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from eagle3_contract.api.base import API_VERSION, KIND
from eagle3_contract.api.validation import parse_spec
from eagle3_operator.builders.names import RunRef
from eagle3_operator.reconcile.observe import Observed
from eagle3_operator.reconcile.planner import plan_run

REPO = Path(__file__).resolve().parents[2]
GITOPS = REPO / "examples" / "gitops"
FILES = sorted(GITOPS.rglob("*.yaml"))


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def one(path: Path) -> dict[str, Any]:
    [doc] = docs(path)
    return doc


def runs() -> list[dict[str, Any]]:
    return [d for p in FILES for d in docs(p) if d.get("kind") == KIND]


def test_the_examples_are_there() -> None:
    names = {str(p.relative_to(GITOPS)) for p in FILES}
    argocd = {"argocd/application.yaml", "argocd/argocd-cm.yaml"}
    assert argocd | {"flux/kustomization.yaml", "flux/gitrepository.yaml"} <= names
    assert "kustomize/kustomization.yaml" in names and runs()


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(GITOPS)) for p in FILES])
def test_every_file_parses_into_kubernetes_objects(path: Path) -> None:
    for doc in docs(path):
        assert isinstance(doc, dict) and doc.get("apiVersion") and doc.get("kind"), path


def test_the_runs_are_valid_pinned_drafts_that_verify_first() -> None:
    for run in runs():
        assert run["apiVersion"] == API_VERSION and "status" not in run
        spec = parse_spec(run["spec"])
        pinned = spec.serving.pinned_checkpoint
        assert pinned is not None and pinned.sha256 is not None, "a promotion pins path and sha256"
        plan = plan_run(RunRef(run["metadata"]["name"], "llm", "u"), 1, run["spec"], None, Observed(), "t")
        jobs = [a.body for a in plan.actions if a.body["kind"] == "Job"]
        assert [j["metadata"]["labels"]["eagle3.dev/stage"] for j in jobs] == ["verify"]
        assert all(a.body["kind"] != "Deployment" for a in plan.actions), "vLLM waits for verify"


def test_argo_cd_and_flux_apply_the_kustomize_directory_of_one_repository() -> None:
    app = one(GITOPS / "argocd" / "application.yaml")
    flux = one(GITOPS / "flux" / "kustomization.yaml")
    source = one(GITOPS / "flux" / "gitrepository.yaml")
    kustomize = one(GITOPS / "kustomize" / "kustomization.yaml")
    assert (app["apiVersion"], app["kind"]) == ("argoproj.io/v1alpha1", "Application")
    assert (flux["apiVersion"], flux["kind"]) == ("kustomize.toolkit.fluxcd.io/v1", "Kustomization")
    assert (source["apiVersion"], source["kind"]) == ("source.toolkit.fluxcd.io/v1", "GitRepository")
    assert app["spec"]["source"]["repoURL"] == source["spec"]["url"]
    assert flux["spec"]["sourceRef"] == {"kind": "GitRepository", "name": source["metadata"]["name"]}
    assert flux["metadata"]["namespace"] == source["metadata"]["namespace"]
    for path in (app["spec"]["source"]["path"], flux["spec"]["path"]):
        assert (REPO / path / "kustomization.yaml").is_file(), path
    namespace = kustomize["namespace"]
    assert app["spec"]["destination"]["namespace"] == flux["spec"]["targetNamespace"] == namespace
    for resource in kustomize["resources"]:
        assert one(GITOPS / "kustomize" / resource)["kind"] == KIND


def test_flux_waits_for_the_run_it_applies() -> None:
    flux = one(GITOPS / "flux" / "kustomization.yaml")
    names = {r["metadata"]["name"] for r in runs()}
    [check] = flux["spec"]["healthChecks"]
    assert (check["apiVersion"], check["kind"]) == (API_VERSION, KIND) and check["name"] in names
    assert check["namespace"] == flux["spec"]["targetNamespace"]


def test_the_docs_walk_through_these_files_and_commands() -> None:
    text = (REPO / "docs" / "gitops.md").read_text()
    for path in FILES:
        assert str(path.relative_to(REPO)) in text, path
    for needle in ("eagle3 promote", "--format values", "ChecksumMismatch", "pinnedCheckpoint", "status"):
        assert needle in text, needle
