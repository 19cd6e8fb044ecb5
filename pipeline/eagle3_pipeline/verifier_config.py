"""The verifier's config.json as a dict, for figures that must never fail a stage (status.plan.estimates).

A local directory's config.json is read with the json module (no transformers import, no remote code); a Hub
id goes through transformers' AutoConfig, which prepare's tokenizer load has already made cheap (the files
are in the Hub cache). Any failure gives None: the estimates then say the shape is not known.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from eagle3_contract.estimates import VerifierShape, shape_from_config

logger = logging.getLogger(__name__)
CONFIG_FILE = "config.json"


def read_config(
    model: str, revision: str | None = None, trust_remote_code: bool = False, offline: bool = False
) -> dict[str, Any] | None:
    """`model`'s config as a dict (a local directory's config.json, else AutoConfig's); None if unreadable.
    `offline`: a Hub id is read from the Hub cache only, never downloaded."""
    local: Path | None = Path(model).expanduser() / CONFIG_FILE
    try:
        if offline and local is not None and not local.is_file():
            local = _cached(model, revision)
            if local is None:
                return None
        if local is not None and local.is_file():
            config = json.loads(local.read_text())
        else:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(
                model, revision=revision, trust_remote_code=trust_remote_code, local_files_only=offline
            ).to_dict()
    except Exception as exc:  # an estimate's input: never the reason a stage fails
        logger.info("cannot read the verifier's config at %s (%s: %s)", model, type(exc).__name__, exc)
        return None
    return config if isinstance(config, dict) else None


def _cached(model: str, revision: str | None) -> Path | None:
    """A Hub id's config.json in the Hub cache, without asking the Hub (None: not there)."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(model, CONFIG_FILE, revision=revision)
    return Path(found) if isinstance(found, str) else None


def verifier_shape(
    model: str,
    revision: str | None = None,
    trust_remote_code: bool = False,
    basis: str = "",
    offline: bool = False,
) -> VerifierShape | None:
    """The verifier's hidden size and depth, or None when its config cannot be read or lacks them."""
    config = read_config(model, revision, trust_remote_code, offline)
    return shape_from_config(config, basis or f"from {model}/{CONFIG_FILE}") if config is not None else None
