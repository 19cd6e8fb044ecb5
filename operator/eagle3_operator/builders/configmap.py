"""The immutable ConfigMap holding the run document every stage Job reads."""

from __future__ import annotations

import json
from typing import Any

from eagle3_contract.api.base import API_VERSION, KIND
from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.api.validation import spec_document
from eagle3_operator.builders import names
from eagle3_operator.builders.names import RunRef
from eagle3_operator.builders.pod import SPEC_KEY

SPEC_STAGE = "spec"


def run_document(run: RunRef, spec: Eagle3RunSpec) -> str:
    """The run file a stage program reads: the Eagle3Run as stored, without status."""
    document = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": run.name, "namespace": run.namespace},
        "spec": spec_document(spec),
    }
    return json.dumps(document, indent=2, sort_keys=True)


def build_spec_configmap(run: RunRef, spec: Eagle3RunSpec, spec_hash: str) -> dict[str, Any]:
    """A ConfigMap per spec hash, immutable: a Job always reads the spec it was created for."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": names.metadata(run, names.spec_configmap_name(run.name, spec_hash), SPEC_STAGE),
        "immutable": True,
        "data": {SPEC_KEY: run_document(run, spec)},
    }
