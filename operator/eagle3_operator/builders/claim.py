"""The artifacts PersistentVolumeClaim the operator creates when the spec names none."""

from __future__ import annotations

from typing import Any

from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_operator.builders import names
from eagle3_operator.builders.names import RunRef

ARTIFACTS_STAGE = "artifacts"


def build_artifacts_claim(run: RunRef, spec: Eagle3RunSpec) -> dict[str, Any]:
    """The claim is owned by the run only with `deleteWithRun`; by default the artifacts outlive the run."""
    volume = spec.storage.artifacts
    claim_spec: dict[str, Any] = {
        "accessModes": list(volume.access_modes),
        "resources": {"requests": {"storage": volume.size}},
    }
    if volume.storage_class_name is not None:
        claim_spec["storageClassName"] = volume.storage_class_name
    name = names.artifacts_claim_name(run.name)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": names.metadata(run, name, ARTIFACTS_STAGE, owned=volume.delete_with_run),
        "spec": claim_spec,
    }
