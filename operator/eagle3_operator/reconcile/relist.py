"""Re-listing: what kopf's indexes still hold that the API server no longer has.

kopf drops an index entry only on the object's DELETED event (kopf/_core/engines/indexing.py). When a watch is
re-listed (HTTP 410 after an API server restart or a long disconnect), an object deleted in the gap gets no
event and stays in the index for good: a run deleted meanwhile would be reconciled again and again (its Jobs
created for a uid that no longer exists, the garbage collector deleting them), and a failed Job deleted to
retry would still be seen as failed, so its retry never came. kopf has no hook to rebuild an index, so the
resync does it by uid: it notes every uid the indexes hold, then lists the same collections (metadata only);
an entry held before the list started that the list lacks was deleted, and is a ghost from then on. The
executor never acts on a ghost (`observe` skips it; a ghost run is forgotten), which is the index rebuilt from
the re-list as far as this operator can see.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from eagle3_contract.api.base import GROUP, PLURAL, VERSION
from eagle3_operator.builders import names
from eagle3_operator.k8s import Kube

MANAGED = f"{names.LABEL_MANAGED_BY}={names.MANAGED_BY}"
# kopf index (handlers.py) -> the collection it watches: API prefix, plural, label selector
COLLECTIONS: dict[str, tuple[str, str, str | None]] = {
    "eagle3_runs": (f"/apis/{GROUP}/{VERSION}", PLURAL, None),
    "stage_jobs": ("/apis/batch/v1", "jobs", MANAGED),
    "stage_pods": ("/api/v1", "pods", MANAGED),
    "serving_deployments": ("/apis/apps/v1", "deployments", MANAGED),
    "owned_services": ("/api/v1", "services", MANAGED),
    "owned_configmaps": ("/api/v1", "configmaps", MANAGED),
    "owned_claims": ("/api/v1", "persistentvolumeclaims", MANAGED),
    "owned_pod_monitors": ("/apis/monitoring.coreos.com/v1", "podmonitors", MANAGED),
    "owned_disruption_budgets": ("/apis/policy/v1", "poddisruptionbudgets", MANAGED),
}


def entry_uid(value: Any) -> str | None:
    """The uid of an index entry: a slim body's metadata.uid, or an owned object's (kind, name, hash, uid)."""
    if isinstance(value, Mapping):
        uid = (value.get("metadata") or {}).get("uid")
        return str(uid) if uid else None
    if isinstance(value, tuple) and len(value) == 4:
        return str(value[3]) if value[3] else None
    return None


def index_uids(indexes: Iterable[Mapping[Any, Iterable[Any]]]) -> set[str]:
    """Every uid the indexes hold."""
    return {uid for index in indexes for key in list(index) for v in index[key] if (uid := entry_uid(v))}


def collection_paths(index: str, namespaces: Iterable[str]) -> list[str]:
    """The list paths of an index's collection: per watched namespace, else cluster-wide."""
    prefix, plural, _ = COLLECTIONS[index]
    spaces = list(namespaces)
    if not spaces:
        return [f"{prefix}/{plural}"]
    return [f"{prefix}/namespaces/{ns}/{plural}" for ns in spaces]


async def list_ghosts(
    kube: Kube, indices: Mapping[str, Mapping[Any, Iterable[Any]]], namespaces: Iterable[str]
) -> tuple[set[str], set[str]]:
    """(ghosts, held): the uids the indexes held before listing that no list returned, and all they held.
    Every list must succeed (an ApiError otherwise): a partial listing would make live objects ghosts."""
    held = index_uids(indices.values())  # before listing: whatever the list lacks was deleted before it
    listed: set[str] = set()
    for index in indices:
        _, _, selector = COLLECTIONS[index]
        for path in collection_paths(index, namespaces):
            listed |= await kube.list_uids(path, selector)
    return held - listed, held
