"""Reading an Eagle3Run manifest (the document one would `kubectl apply`) into a validated spec."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from eagle3_contract.api.base import API_VERSION, KIND
from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.api.validation import InvalidSpecError, parse_spec

# A custom resource's name is a DNS-1123 subdomain (k8s.io/apimachinery IsDNS1123Subdomain): the same rule
# locally, so a name the API server refuses never runs here, and a name can never be a path ('/', '..').
DNS_SUBDOMAIN_MAX = 253
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
NAME_RULE = (
    f"a DNS-1123 subdomain: at most {DNS_SUBDOMAIN_MAX} characters, lowercase letters, digits, '-' and '.', "
    "starting and ending with a letter or digit (e.g. 'my-run')"
)


class ManifestError(ValueError):
    """A manifest that cannot run: the message names the file and the field."""


@dataclass(frozen=True)
class Manifest:
    name: str
    namespace: str
    spec: Eagle3RunSpec
    path: Path
    document: dict[str, Any]


class _DuplicateKey(ValueError):
    """A mapping that names a key twice: which value wins is the reader's guess, so it is an error."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key repeated in one mapping (PyYAML keeps the last one silently;
    kubectl's strict decoding reports it)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:  # before merge keys (`<<`) are flattened: overriding one is fine
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str | int | float | bool):
                continue  # unhashable: the base class reports it
            if key in seen:
                line = key_node.start_mark.line + 1
                raise _DuplicateKey(f"duplicate key {key!r} at line {line}: write each key once")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise _DuplicateKey(f"duplicate key {repeated[0]!r}: write each key once")
    return dict(pairs)


def _documents(path: Path) -> list[Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ManifestError(f"{path}: no such file; pass the path of an Eagle3Run manifest") from None
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read it ({exc.strerror})") from None
    try:
        if path.suffix == ".json":
            return [json.loads(text, object_pairs_hook=_unique_pairs)]
        return [doc for doc in yaml.load_all(text, Loader=_UniqueKeyLoader) if doc is not None]
    except _DuplicateKey as exc:
        raise ManifestError(f"{path}: {exc}") from None
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path}: not valid YAML/JSON: {exc}") from None


def _checked_name(path: Path, name: Any) -> str:
    """metadata.name if the API server would accept it, else a ManifestError with the rule."""
    if not isinstance(name, str):
        got = "missing" if name is None else f"a {type(name).__name__}"
        raise ManifestError(f"{path}: metadata.name is {got}; it must be {NAME_RULE}")
    if len(name) > DNS_SUBDOMAIN_MAX or not DNS_SUBDOMAIN.fullmatch(name):
        raise ManifestError(f"{path}: metadata.name {name!r} is invalid; it must be {NAME_RULE}")
    return name


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
    name = _checked_name(path, metadata.get("name"))
    try:
        spec = parse_spec(doc.get("spec"))
    except InvalidSpecError as exc:
        raise ManifestError(f"{path}: invalid Eagle3Run: " + "; ".join(exc.problems)) from None
    namespace = str(metadata.get("namespace") or "default")
    return Manifest(name=name, namespace=namespace, spec=spec, path=path, document=doc)
