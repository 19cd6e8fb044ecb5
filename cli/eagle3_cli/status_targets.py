"""What `eagle3 status TARGET` reads. A path that exists is a local run: a manifest file, the artifacts
directory that `eagle3 run` wrote (its `.runs/` holds the manifest it ran and what it recorded), a directory
of such artifacts directories holding one, or a directory holding one Eagle3Run manifest. Anything else is
the name of an Eagle3Run in the cluster (and so is every target with -n or --kubeconfig).
"""

from __future__ import annotations

import os
from pathlib import Path

from eagle3_cli.status import Observed, Reader
from eagle3_contract.api.base import KIND
from eagle3_contract.api.manifest import ManifestError, load_manifest, manifest_documents

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
WHAT_TO_GIVE = (
    "give a run's manifest file, its artifacts directory (./eagle3-artifacts/<run> by default), or the name "
    "of an Eagle3Run in the cluster"
)


class TargetError(ValueError):
    """A TARGET that names no run: what it is, and what to give instead."""


def is_path(target: str) -> bool:
    """A target that can only be a path: it exists, has a manifest's suffix or a `/` (no run name has)."""
    return Path(target).exists() or target.endswith(MANIFEST_SUFFIXES) or os.sep in target


def snapshots(directory: Path) -> list[Path]:
    """The manifests `eagle3 run` copied into the artifacts directory `directory` (one per run name)."""
    from eagle3_pipeline.local.status import STATUS_SUFFIX, status_file

    runs = status_file(directory, "run").parent  # .runs/, beside each run's recorded status
    if not runs.is_dir():
        return []
    return sorted(
        p
        for p in runs.iterdir()
        if p.is_file() and p.name.endswith(MANIFEST_SUFFIXES) and not p.name.endswith(STATUS_SUFFIX)
    )


def manifests_in(directory: Path) -> list[Path]:
    """The files right in `directory` that hold an Eagle3Run (files that do not parse are no manifests)."""
    found = []
    for path in sorted(directory.iterdir()):
        if not (path.is_file() and path.name.endswith(MANIFEST_SUFFIXES)):
            continue
        try:
            documents = manifest_documents(path)
        except ManifestError:
            continue
        if any(isinstance(d, dict) and d.get("kind") == KIND for d in documents):
            found.append(path)
    return found


def _names(paths: list[Path]) -> str:
    return ", ".join(str(p) for p in paths)


def _artifacts_directory(directory: Path, found: list[Path], artifacts: str | None) -> tuple[Path, str]:
    if artifacts is not None:
        raise TargetError(
            f"{directory} is an artifacts directory of `eagle3 run`: drop --artifacts (it goes with a "
            "manifest file)"
        )
    if len(found) > 1:
        raise TargetError(
            f"{directory} holds the records of {len(found)} runs ({_names(found)}); give one of these "
            f"manifests with --artifacts {directory}"
        )
    return found[0], str(directory)


def local_run(target: Path, artifacts: str | None) -> tuple[Path, str | None]:
    """The manifest and the artifacts directory (None: the manifest's default) of the local run `target`
    names; TargetError for a directory that holds none, or several."""
    if not target.exists():
        raise TargetError(f"{target}: no such file or directory; {WHAT_TO_GIVE}")
    if not target.is_dir():
        return target, artifacts
    found = snapshots(target)
    if found:
        return _artifacts_directory(target, found, artifacts)
    held = manifests_in(target)
    if len(held) > 1:
        raise TargetError(
            f"{target} holds {len(held)} Eagle3Run manifests ({_names(held)}); give one of them"
        )
    if held:
        return held[0], artifacts
    runs = [d for d in sorted(target.iterdir()) if d.is_dir() and snapshots(d)]
    if len(runs) == 1:
        return local_run(runs[0], artifacts)
    if runs:
        raise TargetError(
            f"{target} holds the artifacts directories of {len(runs)} runs; give one of them: {_names(runs)}"
        )
    raise TargetError(
        f"{target} is neither an artifacts directory of `eagle3 run` (no .runs/ with the manifest it ran) "
        f"nor a directory holding an Eagle3Run manifest; {WHAT_TO_GIVE}"
    )


def local_reader(target: str, artifacts: str | None) -> Reader:
    """The local run `target` names, read by `eagle3 run`'s own reader (its artifacts, and what it recorded
    there); ValueError for a bad manifest or a directory that names no run."""
    from eagle3_pipeline.commands import local_status_reader
    from eagle3_pipeline.local.run import default_artifacts

    manifest, root = local_run(Path(target), artifacts)
    run = load_manifest(manifest)  # its name and default artifacts; the reader reads it again each time
    where = root or str(default_artifacts(run))
    read = local_status_reader(str(manifest), where)

    def observe() -> Observed:
        title, status = read()
        return Observed(title, status, {"name": run.name, "artifacts": where})

    return observe


def cluster_reader(name: str, namespace: str | None, kubeconfig: str | None, note: bool) -> Reader:
    """The Eagle3Run `name` in the cluster (in `namespace`, else the kubeconfig context's); with `note`, a run
    with no stage observed yet says whether an operator is running."""
    from eagle3_operator.commands import cluster_status_reader, operator_presence
    from eagle3_operator.credentials import current_namespace

    where = namespace or current_namespace(kubeconfig)
    read = cluster_status_reader(name, where, kubeconfig)

    def observe() -> Observed:
        title, status = read()
        told = (
            f"no stage observed yet; {operator_presence(where, kubeconfig)}"
            if note and not status.stages
            else ""
        )
        return Observed(title, status, {"name": name, "namespace": where}, told)

    return observe
