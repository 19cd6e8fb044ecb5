"""The API mock for counting the operator's requests: the tests' Emulator with a short memory and a tally.

kmock keeps every request it served, and matches each new one against its reactions by scanning that whole
history: O(requests) per request, quadratic over a run of hundreds of Eagle3Runs, so the mock, not the
operator, would be what a budget test or a benchmark measures. Here a request is forgotten once served, and
one named object is looked up by its key instead of by a scan of all objects.

Requests are tallied by kind (`GET eagle3runs (handlers)`: kmock's verb, the plural, a subresource, and
whose they are: `kopf` for kopf's own bookkeeping, `handlers` for this project's client). A client that
sends the User-Agent `driver_agent` (the test's or the benchmark's own) is not counted.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import kmock

from tests.harness.cluster import Emulator

DRIVER_AGENT = "eagle3-driver"


class CountingEmulator(Emulator):
    driver_agent = DRIVER_AGENT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tally: Counter[str] = Counter()
        self.last_request = 0.0  # monotonic time of the operator's last request

    def kind_of(self, request: Any) -> str | None:
        """How a request is tallied; None for the driver's own and for watches (streams, not calls)."""
        agent = request.headers.get("User-Agent", "")
        if agent.startswith(self.driver_agent) or request.action == kmock.action.WATCH:
            return None
        verb = (request.action or request.method).name
        plural = getattr(request.resource, "plural", None) or "-"
        sub = f"/{request.subresource}" if request.subresource else ""
        return f"{verb} {plural}{sub} ({'kopf' if agent.startswith('kopf') else 'handlers'})"

    def _KubernetesEmulator__get_objs(self, request: Any, strict: bool) -> list[Any]:
        if request.name is not None and (strict or request.namespace is not None):
            found = self._objects._objects.get((request.resource, request.namespace, request.name))
            return [] if found is None else [found]
        objs: list[Any] = super()._KubernetesEmulator__get_objs(request, strict)  # type: ignore[misc]
        return objs

    async def _handle(self, request: Any) -> Any:
        try:
            return await self._observe(request)
        finally:
            history = self._requests
            for i in range(len(history) - 1, -1, -1):
                if history[i] is request:
                    del history[i]
                    break

    async def _observe(self, request: Any) -> Any:
        """Tally the request, then serve it (`_serve`); a subclass that watches more overrides this."""
        what = self.kind_of(request)
        if what is not None:
            self.tally[what] += 1
            self.last_request = time.monotonic()
        return await self._serve(request)

    async def _serve(self, request: Any) -> Any:
        return await super()._handle(request)


def per_run(tally: Counter[str], runs: int) -> dict[str, float]:
    """Requests per run by kind, and their total under "total"."""
    out = {what: n / runs for what, n in tally.items()}
    return out | {"total": sum(tally.values()) / runs}
