"""Reading an Eagle3Run manifest (the document one would `kubectl apply`) into a validated spec."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from eagle3_contract.api.base import API_VERSION, KIND
from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.api.validation import InvalidSpecError, parse_spec

DNS_NAME_MAX = 63


class ManifestError(ValueError):
    """A manifest that cannot run: the message names the file and the field."""


@dataclass(frozen=True)
class Manifest:
    name: str
    namespace: str
    spec: Eagle3RunSpec
    path: Path
    document: dict[str, Any]


def _documents(path: Path) -> list[Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ManifestError(f"{path}: no such file; pass the path of an Eagle3Run manifest") from None
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read it ({exc.strerror})") from None
    try:
        if path.suffix == ".json":
            return [json.loads(text)]
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path}: not valid YAML/JSON: {exc}") from None


def load_manifest(path: str | Path) -> Manifest:
    """The one Eagle3Run in `path`, validated; raises ManifestError naming the field that is wrong."""
    path = Path(path)
    runs = [d for d in _documents(path) if isinstance(d, dict) and d.get("kind") == KIND]
    if len(runs) != 1:
        raise ManifestError(f"{path}: expected exactly one document of kind {KIND}, found {len(runs)}")
    doc = runs[0]
    if doc.get("apiVersion") != API_VERSION:
        raise ManifestError(
            f"{path}: apiVersion is {doc.get('apiVersion')!r}; this version reads {API_VERSION}"
        )
    metadata = doc.get("metadata") or {}
    name = metadata.get("name")
    if not isinstance(name, str) or not name or len(name) > DNS_NAME_MAX:
        raise ManifestError(f"{path}: metadata.name must be a DNS name of at most {DNS_NAME_MAX} characters")
    try:
        spec = parse_spec(doc.get("spec"))
    except InvalidSpecError as exc:
        raise ManifestError(f"{path}: invalid Eagle3Run: " + "; ".join(exc.problems)) from None
    namespace = str(metadata.get("namespace") or "default")
    return Manifest(name=name, namespace=namespace, spec=spec, path=path, document=doc)
