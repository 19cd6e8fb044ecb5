"""The JSON merge patch (RFC 7386) that turns one status document into another.

Written here rather than taken from a library: the one PyPI package for it (json-merge-patch) is unmaintained,
and the operator needs one extra rule (leave kopf's own `status.kopf` alone), in twelve lines.
"""

from __future__ import annotations

from typing import Any


def merge_patch(old: dict[str, Any], new: dict[str, Any], ignore: tuple[str, ...] = ()) -> dict[str, Any]:
    """A merge patch from `old` to `new` (None deletes a key; lists are replaced whole); {} if equal."""
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys() - set(ignore):
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            inner = merge_patch(before, value)
            if inner:
                patch[key] = inner
        elif value != before or key not in old:
            patch[key] = value
    return patch
