"""What the cluster's Kubernetes version offers the operator's Jobs, and what the operator does without it.

Read once at start (`GET /version`, OperatorState.start). An API server drops the fields of a Job it does not
know, silently: a Job that relies on one behaves otherwise, and nothing says so. So the operator says, once,
what it uses on this server and what it does instead:

- `podFailurePolicy` (on by default from 1.26): an out-of-memory exit of extract or generate (the contract's
  exit code 86) or a failed verify check fails the Job at once, and a pod disruption does not count against
  the backoff limit. Without it the Job controller would run the same attempt again, backoffLimit times, at
  the same token budget; the operator fails the Job itself at the first such exit (it deletes the Job and
  starts the next attempt, or records the failure). Disruptions count against the backoff limit there.
- Indexed Jobs (`completionMode: Indexed`, on by default from 1.22): a train stage of several nodes is one.
  Without them the run is refused with a condition that names the cluster's version.
- `x-kubernetes-validations` (CEL, from 1.25): without it the API server accepts what the CRD's rules refuse;
  the operator checks the same rules itself (eagle3_contract.api.validation) and sets SpecValid False.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# the Failed condition's reason where a run needs what the cluster does not offer (Indexed Jobs)
UNSUPPORTED_BY_CLUSTER = "UnsupportedByCluster"
POD_FAILURE_POLICY_MINOR = 26
INDEXED_JOBS_MINOR = 22
CEL_MINOR = 25


@dataclass(frozen=True)
class ServerFeatures:
    """The server's version (`v1.20.2`) and minor (None: unknown, taken for a current one)."""

    version: str = ""
    minor: int | None = None

    def _at_least(self, minor: int) -> bool:
        return self.minor is None or self.minor >= minor

    @property
    def pod_failure_policy(self) -> bool:
        return self._at_least(POD_FAILURE_POLICY_MINOR)

    @property
    def indexed_jobs(self) -> bool:
        return self._at_least(INDEXED_JOBS_MINOR)

    @property
    def cel(self) -> bool:
        return self._at_least(CEL_MINOR)

    def fallbacks(self) -> list[str]:
        """What the operator does otherwise on this server (empty: it uses every feature)."""
        out = []
        if not self.pod_failure_policy:
            out.append(
                "no Job podFailurePolicy: the operator fails a stage Job itself at an out-of-memory exit "
                "(then retries with half the token budget) or a failed check; pod disruptions count against "
                "the backoff limit"
            )
        if not self.indexed_jobs:
            out.append("no Indexed Jobs: a train stage of several nodes (training.nodes > 1) is refused")
        if not self.cel:
            out.append("no CEL rules in CRDs: the operator checks the spec's rules itself (SpecValid)")
        return out


def server_features(version: dict[str, object] | None) -> ServerFeatures:
    """From the body of `GET /version` (`major`, `minor` such as "20" or "20+", `gitVersion`); None or an
    unreadable one: unknown (everything taken as available)."""
    if not version:
        return ServerFeatures()
    git = str(version.get("gitVersion") or "")
    found = re.match(r"\d+", str(version.get("minor") or ""))
    if found is None:
        found = re.match(r"v?\d+\.(\d+)", git)
        minor = int(found.group(1)) if found else None
    else:
        minor = int(found.group(0))
    return ServerFeatures(version=git, minor=minor if str(version.get("major") or "1") == "1" else None)
