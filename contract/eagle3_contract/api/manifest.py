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


# The API server refuses a request body over 3 MiB; a manifest's aliases may not expand past this many values
# (go-yaml, which the API server reads YAML with, refuses excessive aliasing too).
MAX_MANIFEST_BYTES = 3 * 1024 * 1024
MAX_EXPANDED_NODES = 1_000_000


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


class _TooLarge(ValueError):
    """A document whose aliases expand past what any manifest needs (a 'billion laughs' file)."""


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """The number of nodes `node` stands for once every alias is expanded, computed once per node (a node an
    alias points at is the same object), iteratively: no recursion limit, whatever the depth."""
    pending: list[tuple[yaml.Node, bool]] = [(node, False)]
    while pending:
        current, children_done = pending.pop()
        if id(current) in sizes:
            continue
        children = _children(current)
        if children_done or not children:
            sizes[id(current)] = min(1 + sum(sizes[id(c)] for c in children), MAX_EXPANDED_NODES + 1)
            continue
        pending.append((current, True))
        pending.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(node)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _yaml_documents(text: str) -> list[Any]:
    loader = _UniqueKeyLoader(text)
    try:
        documents = []
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            expanded = _expanded_size(node, {})
            if expanded > MAX_EXPANDED_NODES:
                raise _TooLarge(
                    f"its aliases expand to more than {MAX_EXPANDED_NODES:,} values (an alias bomb?); a "
                    "manifest needs a few hundred: write it without nested aliases"
                )
            documents.append(loader.construct_document(node))
        return [doc for doc in documents if doc is not None]
    finally:
        loader.dispose()


def read_manifest_text(path: Path) -> str:
    """The manifest file's text: UTF-8 (as kubectl reads it), at most the API server's request size."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ManifestError(f"{path}: no such file; pass the path of an Eagle3Run manifest") from None
    except IsADirectoryError:
        raise ManifestError(f"{path}: a directory; pass the path of an Eagle3Run manifest file") from None
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read it ({exc.strerror})") from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(
            f"{path}: {len(data):,} bytes, more than the {MAX_MANIFEST_BYTES:,} an API server accepts in one "
            "request; is it the right file?"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(
            f"{path}: not UTF-8 text (byte {data[exc.start]:#04x} at offset {exc.start}); save it as UTF-8"
        ) from None


def manifest_documents(path: Path) -> list[Any]:
    """Every document of a YAML (or .json) manifest file, for each command that reads one: an Eagle3Run and
    whatever else `kubectl apply -f` would take with it (a ConfigMap, a Namespace)."""
    return parse_documents(read_manifest_text(path), str(path), is_json=path.suffix == ".json")


def parse_documents(text: str, where: str, is_json: bool = False) -> list[Any]:
    """The documents of a manifest's text (`where` names it in errors): keys unique, aliases bounded."""
    try:
        if is_json:
            return [json.loads(text, object_pairs_hook=_unique_pairs)]
        return _yaml_documents(text)
    except (_DuplicateKey, _TooLarge) as exc:
        raise ManifestError(f"{where}: {exc}") from None
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{where}: not valid YAML/JSON: {exc}") from None
    except RecursionError:
        raise ManifestError(f"{where}: nested deeper than a manifest reader follows") from None


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
    runs = [d for d in manifest_documents(path) if isinstance(d, dict) and d.get("kind") == KIND]
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
