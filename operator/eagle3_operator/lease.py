"""One operator at a time: a coordination.k8s.io Lease named `eagle3-operator` in the operator's namespace.

Two operators at once create no duplicate Jobs (names are deterministic), but each emits every phase Event
and both write status. Until the operator has leader election (HA), a second one refuses to start while the
Lease's holder keeps renewing it, and exits if it ever loses the Lease. A holder that stopped renewing (a
killed pod) is taken over once its lease duration has passed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from datetime import UTC, datetime, timedelta
from typing import Any

from eagle3_operator.k8s import ApiError, Kube

logger = logging.getLogger(__name__)

LEASE_NAME = "eagle3-operator"
LEASE_SECONDS = 30
MICRO = "%Y-%m-%dT%H:%M:%S.%fZ"


class PeerActive(Exception):
    """Another live operator holds the Lease."""


def identity() -> str:
    """The holder's name: the pod's name (its hostname in a cluster) and the process id."""
    return f"{os.environ.get('HOSTNAME') or socket.gethostname()}/{os.getpid()}"


def _now() -> datetime:
    return datetime.now(UTC)


def _renewed(lease: dict[str, Any]) -> datetime | None:
    stamp = (lease.get("spec") or {}).get("renewTime") or (lease.get("spec") or {}).get("acquireTime")
    try:
        return datetime.strptime(stamp, MICRO).replace(tzinfo=UTC) if stamp else None
    except ValueError:
        return None


class PeerLease:
    """Take, renew and release the Lease for `holder`."""

    def __init__(self, kube: Kube, namespace: str, holder: str, seconds: int = LEASE_SECONDS) -> None:
        self.kube, self.namespace, self.holder, self.seconds = kube, namespace, holder, seconds
        self.where = f"Lease {namespace}/{LEASE_NAME}"
        self.lost: str | None = None  # the peer that took the Lease from this process

    def _spec(self, acquired: str | None = None) -> dict[str, Any]:
        now = _now().strftime(MICRO)
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.seconds,
            "acquireTime": acquired or now,
            "renewTime": now,
        }

    def _other_holder(self, lease: dict[str, Any]) -> str | None:
        """The live holder that is not us, if any (one whose last renewal is within its duration)."""
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        renewed = _renewed(lease)
        duration = timedelta(seconds=float(spec.get("leaseDurationSeconds") or self.seconds))
        if not holder or holder == self.holder or renewed is None or _now() - renewed > duration:
            return None
        return str(holder)

    async def _try(self) -> str | None:
        """One attempt to take or renew the Lease: None when we hold it, else the live holder's name."""
        lease = await self.kube.lease("get", self.namespace, LEASE_NAME)
        if lease is None:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": self._spec()}
            body["metadata"] = {"name": LEASE_NAME, "namespace": self.namespace}
            try:
                await self.kube.lease("create", self.namespace, LEASE_NAME, body)
            except ApiError as err:
                if err.status != 409:
                    raise
                return await self._try()  # created by a peer meanwhile: read whose it is
            return None
        if holder := self._other_holder(lease):
            return holder
        spec = lease.get("spec") or {}
        mine = spec.get("holderIdentity") == self.holder
        patch = {"metadata": {"resourceVersion": lease["metadata"].get("resourceVersion")}}
        patch["spec"] = self._spec(spec.get("acquireTime") if mine else None)
        try:
            await self.kube.lease("patch", self.namespace, LEASE_NAME, patch)
        except ApiError as err:
            if err.status == 409:  # a peer wrote it between our read and write
                return await self._other_or_unknown()
            raise
        return None

    async def _other_or_unknown(self) -> str:
        lease = await self.kube.lease("get", self.namespace, LEASE_NAME)
        return (self._other_holder(lease) if lease else None) or "another operator"

    async def acquire(self) -> None:
        """Take the Lease, waiting out one lease duration for a holder that may be gone (a killed pod);
        PeerActive when the holder keeps renewing it."""
        deadline = asyncio.get_running_loop().time() + self.seconds + 1
        while (holder := await self._try()) is not None:
            if asyncio.get_running_loop().time() >= deadline:
                raise PeerActive(
                    f"another eagle3 operator is running: {holder} holds the {self.where} and keeps "
                    f"renewing it. Run one operator only (the chart's replicas: 1); if {holder} is gone, "
                    f"this one can start {self.seconds}s after its last renewal."
                )
            logger.warning("%s is held by %s; waiting for it to expire", self.where, holder)
            await asyncio.sleep(min(5.0, self.seconds / 3))
        logger.info("took %s as %s", self.where, self.holder)

    async def keep(self, stop: asyncio.Event) -> None:
        """Renew every third of the duration; set `stop` (the operator stops) if a peer took the Lease.
        A failed renewal (the API server unreachable) is retried: the Lease lapses only after its duration."""
        while not stop.is_set():
            await asyncio.sleep(self.seconds / 3)
            try:
                holder = await self._try()
            except ApiError as err:
                logger.warning("renewing %s failed (retried): %s", self.where, err)
                continue
            if holder is not None:
                logger.error("%s was taken by %s: stopping this operator", self.where, holder)
                self.lost = holder
                stop.set()

    async def release(self) -> None:
        """Hand the Lease back on a clean stop, so a replacement starts at once."""
        try:
            lease = await self.kube.lease("get", self.namespace, LEASE_NAME)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.holder:
                meta = {"resourceVersion": lease["metadata"].get("resourceVersion")}
                patch = {"metadata": meta, "spec": {"holderIdentity": None}}
                await self.kube.lease("patch", self.namespace, LEASE_NAME, patch)
        except ApiError as err:
            logger.warning("could not release %s (it expires by itself): %s", self.where, err)
