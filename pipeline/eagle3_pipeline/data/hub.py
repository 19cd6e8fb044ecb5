"""A Hub-id verifier at `verifier.revision`, as a local directory for readers that take no revision.

speculators' trainer reads the verifier's config and its embedding and head tensors by name or path only
(`AutoConfig.from_pretrained(name)`, `hf_hub_download(repo_id=name, ...)`): handed a Hub id it would read the
default branch, not the revision the other stages used. The snapshot directory of that revision in the Hub
cache is a path it reads as a local model. Extract has already loaded the verifier at that revision, so the
snapshot is normally in the cache (the cluster keeps HF_HOME on the model cache volume); otherwise it is
downloaded, at that revision.
"""

from __future__ import annotations

import logging
from pathlib import Path

from eagle3_pipeline.runtime.errors import StageError

logger = logging.getLogger(__name__)

# What speculators reads of a verifier: its config, the safetensors index or single file, and the shards.
SNAPSHOT_PATTERNS = ["*.json", "*.safetensors", "*.py"]


def verifier_at_revision(model: str, revision: str | None) -> str:
    """`model` itself for a local directory or no revision; else the revision's snapshot directory."""
    if not revision or Path(model).is_dir():
        return model
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return str(snapshot_download(model, revision=revision, local_files_only=True))
    except LocalEntryNotFoundError:
        logger.info("verifier %s at revision %s is not in the Hub cache: downloading it", model, revision)
    try:
        return str(snapshot_download(model, revision=revision, allow_patterns=SNAPSHOT_PATTERNS))
    except Exception as exc:
        raise StageError(
            f"verifier.model {model} at verifier.revision {revision}: neither in the Hub cache nor "
            f"downloadable ({type(exc).__name__}: {exc}); check the id and revision, or give the pod the "
            "model cache that extract used (HF_HOME)"
        ) from None
