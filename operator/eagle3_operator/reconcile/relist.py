"""Re-listing: what kopf's indexes still hold that the API server no longer has.

kopf drops an index entry only on the object's DELETED event (kopf/_core/engines/indexing.py). When a watch is
re-listed (HTTP 410 after an API server restart or a long disconnect), an object deleted in the gap gets no
event and stays in the index for good: a run deleted meanwhile would be reconciled again and again (its Jobs
created for a uid that no longer exists, the garbage collector deleting them), and a failed Job deleted to
retry would still be seen as failed, so its retry never came. kopf has no hook to rebuild an index, so the
resync does it by uid: it notes every uid the indexes hold, then lists the same collections (metadata only);
an entry held before the list started that the list lacks was deleted, and is a ghost from then on. The
executor never acts on a ghost (`observe` skips it; a ghost run is forgotten), which is the index rebuilt from
the re-list as far as this operator can see. The other way round, a run the list returns that no index holds
was missed by a watch that went silent: the resync reconciles it from the list (`unseen_runs`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from eagle3_contract.api.base import GROUP, PLURAL, VERSION
from eagle3_operator.builders import names
from eagle3_operator.k8s import Kube

MANAGED = f"{names.LABEL_MANAGED_BY}={names.MANAGED_BY}"
RUNS_INDEX = "eagle3_runs"
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


@dataclass(frozen=True)
class Relisted:
    """What a re-list found: `ghosts`, the uids the indexes held before listing that no list returned;
    `held`, all they held; `unseen_runs`, the runs listed that the indexes never held (a watch that went
    silent missed them), as slim bodies (metadata only) for the resync to reconcile; `listed`, every uid the
    lists returned (each of them is there)."""

    ghosts: set[str]
    held: set[str]
    unseen_runs: list[dict[str, Any]] = field(default_factory=list)
    listed: set[str] = field(default_factory=set)


async def list_ghosts(
    kube: Kube, indices: Mapping[str, Mapping[Any, Iterable[Any]]], namespaces: Iterable[str]
) -> Relisted:
    """Re-list every collection the indexes watch. Every list must succeed (an ApiError otherwise): a
    partial listing would make live objects ghosts."""
    held = index_uids(indices.values())  # before listing: whatever the list lacks was deleted before it
    listed: set[str] = set()
    unseen: list[dict[str, Any]] = []
    for index in indices:
        _, _, selector = COLLECTIONS[index]
        for path in collection_paths(index, namespaces):
            found = await kube.list_metadata(path, selector)
            listed |= {meta["uid"] for meta in found}
            if index == RUNS_INDEX:
                unseen += [_slim(meta) for meta in found if meta["uid"] not in held]
    return Relisted(held - listed, held, unseen, listed)


def _slim(meta: Mapping[str, Any]) -> dict[str, Any]:
    return {"metadata": {k: meta[k] for k in ("namespace", "name", "uid") if k in meta}}
