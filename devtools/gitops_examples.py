"""The GitOps example is what `eagle3 promote` writes (`make examples`), so it cannot drift from the command.

`examples/gitops/kustomize/llama31-8b.yaml` is `eagle3 promote llama31-8b -n llm`'s output for the training
run `examples/llama-3.1-8b.yaml` once it trained: the run as the API server returns it is the example's spec
(with the annotation `kubectl apply` writes) and the committed status of a finished run (TRAINED: its
candidate's path, sha256 and acceptance, the server-set metadata). The command line's own function renders it.

python -m devtools.gitops_examples            # rewrite the example
python -m devtools.gitops_examples --check    # exit 1 naming it when it differs
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from devtools.generated import Generator
from eagle3_contract.api.validation import parse_spec, spec_document
from eagle3_operator.promote import LAST_APPLIED, promotion_text

MAKE_TARGET = "make examples"
TRAINING = "examples/llama-3.1-8b.yaml"
TRAINED = "tests/fixtures/gitops/llama31-8b-trained.yaml"
PROMOTED = "examples/gitops/kustomize/llama31-8b.yaml"


def _one(path: Path) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise ValueError(f"{path}: expected one YAML mapping, found {len(docs)} document(s)")
    return docs[0]


def trained_run(root: Path) -> dict[str, Any]:
    """The training run as `kubectl get e3r -o yaml` prints it after it trained: TRAINING's manifest as
    applied (defaults filled in, as the API server stores it) with TRAINED's metadata and status."""
    manifest, trained = _one(root / TRAINING), _one(root / TRAINED)
    metadata = dict(manifest["metadata"]) | {
        k: v for k, v in trained["metadata"].items() if k != "annotations"
    }
    applied = manifest | {"metadata": manifest["metadata"] | {"namespace": metadata["namespace"]}}
    last_applied = json.dumps(applied, separators=(",", ":"), sort_keys=True)
    metadata["annotations"] = trained["metadata"].get("annotations", {}) | {LAST_APPLIED: last_applied}
    spec = spec_document(parse_spec(manifest["spec"]))
    return manifest | {"metadata": metadata, "spec": spec, "status": trained["status"]}


def render_promoted(root: Path) -> str:
    """What `eagle3 promote` prints for the trained run."""
    text, _ = promotion_text(trained_run(root))
    return text


GENERATOR = Generator(
    outputs={PROMOTED: render_promoted},
    prog="python -m devtools.gitops_examples",
    doc=__doc__,
    stale_message=f"differs from what `eagle3 promote` writes: run `{MAKE_TARGET}`",
)

if __name__ == "__main__":
    raise SystemExit(GENERATOR.main())
