"""The verifier's config: its shape as the stages need it, and as the estimates read it.

`verifier_dims` reads the layers, hidden size and vocabulary a stage works with (extract, and train and
`eagle3 produce` in online mode) through transformers' AutoConfig; a config it cannot read fails the stage
with advice. `estimated_shape` is for figures that must never fail a stage (status.plan.estimates): a local
directory's config.json is read with the json module (no transformers import, no remote code); a Hub
id goes through transformers' AutoConfig, which prepare's tokenizer load has already made cheap (the files
are in the Hub cache). Any failure gives None: the estimates then say the shape is not known.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_contract.estimates import VerifierShape, shape_from_config
from eagle3_pipeline.runtime.errors import StageError

logger = logging.getLogger(__name__)
CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class LocalVerifier:
    """Where the verifier's weights are, as the stage program sees them."""

    path: str
    revision: str | None
    trust_remote_code: bool


@dataclass(frozen=True)
class VerifierDims:
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int | None


def verifier_dims(ref: LocalVerifier) -> VerifierDims:
    """Layers, hidden size and vocabulary from the verifier's config (the text config of multimodal ones)."""
    from transformers import AutoConfig  # transformers is slow to import: only the stages that read it pay

    try:
        config = AutoConfig.from_pretrained(
            ref.path, revision=ref.revision, trust_remote_code=ref.trust_remote_code
        )
    except (OSError, ValueError) as exc:
        raise StageError(
            f"spec.verifier.model {ref.path}: cannot read its config ({exc}); check the id or path, the "
            "revision and verifier.trustRemoteCode"
        ) from None
    text = config.get_text_config()
    layers, hidden = getattr(text, "num_hidden_layers", None), getattr(text, "hidden_size", None)
    if not isinstance(layers, int) or not isinstance(hidden, int):
        raise StageError(f"spec.verifier.model {ref.path}: its config has no num_hidden_layers/hidden_size")
    vocab = getattr(text, "vocab_size", None)
    return VerifierDims(layers, hidden, vocab if isinstance(vocab, int) else None)


class ConfigUnreadable(ValueError):
    """A model directory's config.json that gives no config: the message names the file and why."""


def local_config(directory: Path) -> dict[str, Any]:
    """The config.json of a model directory on this machine, read with the json module; ConfigUnreadable
    where the directory or the file is missing, or the file is not a JSON object."""
    path = directory / CONFIG_FILE
    if not directory.exists():
        raise ConfigUnreadable(f"{directory} does not exist")
    if not path.is_file():
        raise ConfigUnreadable(f"{directory} has no {CONFIG_FILE}")
    try:
        config = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigUnreadable(f"{path} cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:  # json.JSONDecodeError, UnicodeDecodeError
        raise ConfigUnreadable(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ConfigUnreadable(f"{path} is not a JSON object (it holds a {type(config).__name__})")
    return config


def read_config(
    model: str, revision: str | None = None, trust_remote_code: bool = False, offline: bool = False
) -> dict[str, Any] | None:
    """`model`'s config as a dict (a local directory's config.json, else AutoConfig's); None if unreadable.
    `offline`: a Hub id is read from the Hub cache only, never downloaded."""
    directory = Path(model).expanduser()
    try:
        if offline and not (directory / CONFIG_FILE).is_file():
            cached = _cached(model, revision)
            if cached is None:
                return None
            directory = cached.parent
        if (directory / CONFIG_FILE).is_file():
            return local_config(directory)
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


def estimated_shape(
    model: str,
    revision: str | None = None,
    trust_remote_code: bool = False,
    basis: str = "",
    offline: bool = False,
) -> VerifierShape | None:
    """The verifier's hidden size and depth, or None when its config cannot be read or lacks them."""
    config = read_config(model, revision, trust_remote_code, offline)
    return shape_from_config(config, basis or f"from {model}/{CONFIG_FILE}") if config is not None else None
