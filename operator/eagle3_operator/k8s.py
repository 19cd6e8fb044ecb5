"""The only module that talks to the Kubernetes API server (kubernetes_asyncio)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import client, config

from eagle3_contract.api.base import GROUP, PLURAL, VERSION
from eagle3_contract.patch_guard import PatchGuard, Source
from eagle3_operator.credentials import NoCredentials, in_a_pod, kubeconfig_files, kubeconfig_found

logger = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
# (apiVersion, kind) -> (API class, method suffix) of kubernetes_asyncio's typed APIs.
TYPED: dict[tuple[str, str], tuple[type[Any], str]] = {
    ("batch/v1", "Job"): (client.BatchV1Api, "namespaced_job"),
    ("v1", "ConfigMap"): (client.CoreV1Api, "namespaced_config_map"),
    ("v1", "PersistentVolumeClaim"): (client.CoreV1Api, "namespaced_persistent_volume_claim"),
    ("v1", "Service"): (client.CoreV1Api, "namespaced_service"),
    ("apps/v1", "Deployment"): (client.AppsV1Api, "namespaced_deployment"),
    ("policy/v1", "PodDisruptionBudget"): (client.PolicyV1Api, "namespaced_pod_disruption_budget"),
}
CUSTOM_PLURALS = {"PodMonitor": "podmonitors", "Eagle3Run": PLURAL}
# kopf's peering objects (eagle3_operator.peering): ClusterKopfPeering and KopfPeering
PEERING_API = ("kopf.dev", "v1")
# Without limits, kubernetes_asyncio's aiohttp timeout never fires: a call on a connection that went silent
# (a partition, a dead load balancer: no reset) would be awaited forever while its run's lock is held.
CONNECT_SECONDS = 10.0
TOTAL_SECONDS = 30.0
LIST_PAGE = 500
# Metadata only (client-go's metadata client asks the same); a server without it answers a full list.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"


# kubernetes_asyncio builds its aiohttp session with trust_env=True and has no switch for it: every request
# then reads ~/.netrc and the proxy environment in a worker thread (a quarter of the operator's CPU at 500
# runs). `untrusting_env` gives its client a session built as kubernetes_asyncio builds it, over the same
# connector, with trust_env=False (aiohttp's public API: ClientSession, its connector, detach()). kopf's own
# session does not trust the environment either; a kubeconfig proxy-url still applies (passed per call).
REST_SESSION_GUARD = PatchGuard(
    patch=__name__,
    distribution="kubernetes_asyncio",
    version="36.1.0",
    sources=(
        Source(
            "kubernetes_asyncio.client.rest:RESTClientObject.__init__",
            "205e120177842a9e30d7f87e55a7f5207fb361b355af8ec1704610b7e49c34c5",
            "its pool_manager is an aiohttp.ClientSession over its own connector, with trust_env=True and "
            "read_bufsize=2**21 and nothing else set (untrusting_env builds the same with trust_env=False)",
        ),
        Source(
            "kubernetes_asyncio.client.rest:RESTClientObject.request",
            "c516f572917bf1c2211c42d1be9ad58516c010d9df29d6f86a581de2dd94664b",
            "every request goes through self.pool_manager, the configured proxy passed with each call",
        ),
    ),
    remove_when="kubernetes_asyncio lets its caller choose the session's trust_env",
)
READ_BUFSIZE = 2**21  # kubernetes_asyncio's: a watch event of a large object exceeds aiohttp's default


def untrusting_env(api: client.ApiClient) -> None:
    """Replace `api`'s aiohttp session by one that does not read the environment (REST_SESSION_GUARD)."""
    REST_SESSION_GUARD.check()
    rest = api.rest_client
    stock = rest.pool_manager
    rest.pool_manager = aiohttp.ClientSession(
        connector=stock.connector, trust_env=False, read_bufsize=READ_BUFSIZE
    )
    stock.detach()  # the connector is the new session's now; the stock one is closed without closing it


class ApiError(Exception):
    """An API call the server refused; `status` is the HTTP status, `detail` the body it answered with (a
    Status object, as JSON, from a real server)."""

    def __init__(self, status: int, verb: str, what: str, detail: str) -> None:
        self.status = status
        self.verb = verb
        self.what = what
        self.detail = detail
        super().__init__(f"{verb} {what}: HTTP {status}: {detail[:500]}")

    @property
    def invalid(self) -> bool:
        """The server refused the object itself (HTTP 422 Unprocessable Entity, reason Invalid): a field it
        does not take. Sending the same object again is refused again."""
        return self.status == 422

    def server_status(self) -> dict[str, Any]:
        """The Status object the server answered with (message, reason, details.causes), {} if none."""
        try:
            found = json.loads(self.detail)
        except ValueError:
            return {}
        return found if isinstance(found, dict) and found.get("kind") == "Status" else {}

    def fields(self) -> list[str]:
        """The fields the server named in the Status's causes, in its order, each once."""
        causes = (self.server_status().get("details") or {}).get("causes") or []
        found = [c["field"] for c in causes if isinstance(c, dict) and isinstance(c.get("field"), str)]
        return list(dict.fromkeys(found))

    def server_message(self) -> str:
        """The server's own words: the Status's message, else the body as it came (shortened)."""
        message = self.server_status().get("message")
        return str(message) if message else " ".join(self.detail.split())[:1000]

    @property
    def transient(self) -> bool:
        return self.status in (408, 409, 429) or self.status >= 500

    @property
    def not_found(self) -> bool:
        """The object is not there (HTTP 404), as against its kind not being served for now (NotServed)."""
        return self.status == 404 and not self.transient


class NotServed(ApiError):
    """HTTP 404 from a path whose kind the API server does not serve at the moment: an API server that has
    just started answers 404 for custom resources until it has loaded their CRDs, and so does one whose CRD
    was never installed. Transient (retried): it says nothing about whether the object is there."""

    def __init__(self, verb: str, what: str) -> None:
        super().__init__(
            404,
            verb,
            what,
            f"the API server does not serve {PLURAL}.{GROUP}/{VERSION}: is the CRD installed (`kubectl get "
            f"crd {PLURAL}.{GROUP}`)? An API server that has just started serves it once it has loaded it",
        )

    @property
    def transient(self) -> bool:
        return True


class ApiUnreachable(ApiError):
    """An API call that got no answer: it timed out or the connection failed. Always transient (retried);
    the server may or may not have applied a write, which the retry's AlreadyExists / NotFound absorbs."""

    def __init__(self, verb: str, what: str, cause: BaseException) -> None:
        reason = "no answer within its timeout" if isinstance(cause, TimeoutError) else repr(cause)
        super().__init__(0, verb, what, f"{reason} (the API server is unreachable or stalled; retried)")
        self.cause = cause

    @property
    def transient(self) -> bool:
        return True


class Kube:
    """Creates, patches and deletes children, and writes Eagle3Run status. Responses are not deserialised."""

    def __init__(
        self,
        api: client.ApiClient,
        connect_seconds: float = CONNECT_SECONDS,
        total_seconds: float = TOTAL_SECONDS,
    ) -> None:
        self.api = api
        self.total_seconds = total_seconds
        self.timeout = aiohttp.ClientTimeout(
            total=total_seconds,
            connect=connect_seconds,
            sock_connect=connect_seconds,
            sock_read=total_seconds,
        )
        untrusting_env(api)
        self.custom = client.CustomObjectsApi(api)
        self._typed: dict[type[Any], Any] = {}

    @classmethod
    async def connect(cls, total_seconds: float = TOTAL_SECONDS, kubeconfig: str | None = None) -> Kube:
        """In-cluster credentials in a pod unless `kubeconfig` is given, else the kubeconfig (`kubeconfig`,
        $KUBECONFIG or ~/.kube/config); every call answered within `total_seconds` or retried."""
        if kubeconfig is None and in_a_pod():
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        else:
            await config.load_kube_config(config_file=kubeconfig or os.environ.get("KUBECONFIG"))
        return cls(client.ApiClient(), min(CONNECT_SECONDS, total_seconds), total_seconds)

    @classmethod
    async def connect_checked(
        cls, total_seconds: float = TOTAL_SECONDS, kubeconfig: str | None = None
    ) -> Kube:
        """`connect`, its failures a NoCredentials in one line: in a pod its service account, else a
        kubeconfig file that exists, parses and names a current context."""
        pod = kubeconfig is None and in_a_pod()
        files = ", ".join(kubeconfig_files(kubeconfig))
        if not pod and not kubeconfig_found(kubeconfig):
            raise NoCredentials(f"no kubeconfig: {files} does not exist", missing=True)
        where = "the pod's service account" if pod else f"kubeconfig {files}"
        try:
            return await cls.connect(total_seconds, kubeconfig)
        except config.ConfigException as exc:
            detail = str(exc)
            if "current-context" in detail:
                detail = "it names no current context; choose one with `kubectl config use-context NAME`"
            raise NoCredentials(f"{where} is not usable: {detail}") from None
        except (yaml.YAMLError, ValueError, OSError) as exc:
            detail = " ".join(str(exc).split())
            raise NoCredentials(
                f"{where} is not usable ({type(exc).__name__}: {detail}); fix or replace it"
            ) from None

    async def close(self) -> None:
        await self.api.close()

    def _method(self, verb: str, body: dict[str, Any]) -> tuple[Any, tuple[Any, ...]]:
        meta = body["metadata"]
        key = (body["apiVersion"], body["kind"])
        if key in TYPED:
            api_cls, suffix = TYPED[key]
            api = self._typed.setdefault(api_cls, api_cls(self.api))
            args: tuple[Any, ...] = (
                (meta["namespace"],) if verb == "create" else (meta["name"], meta["namespace"])
            )
            return getattr(api, f"{verb}_{suffix}"), args
        group, version = body["apiVersion"].split("/")
        plural = CUSTOM_PLURALS[body["kind"]]
        target = (group, version, meta["namespace"], plural) + (() if verb == "create" else (meta["name"],))
        return getattr(self.custom, f"{verb}_namespaced_custom_object"), target

    async def _send(self, verb: str, what: str, call: Awaitable[Any], read: bool = True) -> tuple[int, str]:
        """Await one call and read its body (unless `read` is False and it succeeded), all within the total
        timeout. A timeout or a failed connection is an `ApiUnreachable`."""
        try:
            async with asyncio.timeout(self.total_seconds):
                response = await call
                try:
                    status = int(response.status)
                    return status, await response.text() if read or status >= 300 else ""
                finally:
                    response.release()
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            raise ApiUnreachable(verb, what, err) from err

    async def _write(self, verb: str, what: str, call: Awaitable[Any]) -> int:
        status, text = await self._send(verb, what, call, read=False)
        if status >= 300:
            raise ApiError(status, verb, what, text)
        return status

    async def apply(self, verb: str, body: dict[str, Any]) -> bool:
        """Carry out one write (`create`, merge-`patch` or `delete` of `body`). False when it was already
        done (AlreadyExists / NotFound)."""
        what = f"{body['kind']} {body['metadata']['namespace']}/{body['metadata']['name']}"
        method, args = self._method(verb, body)
        if verb == "create":
            call = method(*args, body, _preload_content=False, _request_timeout=self.timeout)
        elif verb == "patch":
            call = method(
                *args, body, _content_type=MERGE_PATCH, _preload_content=False, _request_timeout=self.timeout
            )
        else:
            call = method(
                *args, propagation_policy="Background", _preload_content=False, _request_timeout=self.timeout
            )
        try:
            await self._write(verb, what, call)
        except ApiError as err:
            if (verb, err.status) in (("create", 409), ("delete", 404)):
                return False
            raise
        logger.debug("%s %s", verb, what)
        return True

    async def patch_run_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """Merge-patch `status` through the status subresource (a real server rejects a JSON-patch type)."""
        call = self.custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            {"status": patch},
            _content_type=MERGE_PATCH,
            _preload_content=False,
            _request_timeout=self.timeout,
        )  # type: ignore[call-arg]  # fmt: skip  (the stubs omit `_content_type`; the method takes it)
        await self._write("patch status of", f"Eagle3Run {namespace}/{name}", call)

    async def get_run(self, namespace: str, name: str) -> dict[str, Any]:
        """An Eagle3Run as `kubectl get e3r NAME -o json` prints it (spec, status and metadata). A 404 is
        the run's absence only where the kind is served (NotServed otherwise): a restarted API server
        answers 404 for every run until it has loaded the CRD, and a run taken for deleted is forgotten."""
        what = f"Eagle3Run {namespace}/{name}"
        for attempt in range(2):
            call = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _preload_content=False, _request_timeout=self.timeout
            )
            status, text = await self._send("get", what, call)
            if status != 404 or attempt:
                break
            if not await self.serves(GROUP, VERSION, PLURAL):
                raise NotServed("get", what)
            # served now: read once more, since the 404 may have come before the CRD was loaded
        if status == 404:
            raise ApiError(404, "get", what, "not found: check the run's name and namespace (-n)")
        if status >= 300:
            raise ApiError(status, "get", what, text)
        body: dict[str, Any] = json.loads(text)
        return body

    async def peering(
        self, verb: str, namespace: str | None, name: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """`get`, `create` or merge-`patch` kopf's peering object `name` (group kopf.dev): a
        ClusterKopfPeering when `namespace` is None, else a KopfPeering there. None when a `get` finds none or
        a `create` finds one already."""
        group, version = PEERING_API
        plural = "kopfpeerings" if namespace else "clusterkopfpeerings"
        where = (group, version, namespace, plural) if namespace else (group, version, plural)
        scope = "namespaced" if namespace else "cluster"
        options: dict[str, Any] = {"_preload_content": False, "_request_timeout": self.timeout}
        if verb == "get":
            call = getattr(self.custom, f"get_{scope}_custom_object")(*where, name, **options)
        elif verb == "create":
            call = getattr(self.custom, f"create_{scope}_custom_object")(*where, body, **options)
        else:
            method = getattr(self.custom, f"patch_{scope}_custom_object")
            call = method(*where, name, body, _content_type=MERGE_PATCH, **options)
        what = f"{plural}.{group} {namespace + '/' if namespace else ''}{name}"
        status, text = await self._send(verb, what, call)
        if (verb, status) in (("get", 404), ("create", 409)):
            return None
        if status >= 300:
            raise ApiError(status, verb, what, text)
        result: dict[str, Any] = json.loads(text)
        return result

    async def lease(
        self, verb: str, namespace: str, name: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """`get`, `create` or `replace` the coordination.k8s.io/v1 Lease `name` (eagle3_operator.lease); a
        replace is a compare-and-swap on the resourceVersion in `body`. None when a `get` finds none, or a
        `create` or `replace` lost to another writer (HTTP 409: it exists already, or changed since read)."""
        api = self._typed.setdefault(client.CoordinationV1Api, client.CoordinationV1Api(self.api))
        options: dict[str, Any] = {"_preload_content": False, "_request_timeout": self.timeout}
        if verb == "get":
            call = api.read_namespaced_lease(name, namespace, **options)
        elif verb == "create":
            call = api.create_namespaced_lease(namespace, body, **options)
        else:
            call = api.replace_namespaced_lease(name, namespace, body, **options)
        what = f"leases.coordination.k8s.io {namespace}/{name}"
        status, text = await self._send(verb, what, call)
        if (verb, status) in (("get", 404), ("create", 409), ("replace", 409)):
            return None
        if status >= 300:
            raise ApiError(status, verb, what, text)
        result: dict[str, Any] = json.loads(text)
        return result

    async def list_uids(self, path: str, label_selector: str | None = None) -> set[str]:
        """The uids of the objects a collection `path` (e.g. /apis/batch/v1/namespaces/ns/jobs) holds now."""
        return {meta["uid"] for meta in await self.list_metadata(path, label_selector)}

    async def list_metadata(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        """The metadata of the objects a collection `path` holds now: a consistent read (no resourceVersion),
        metadata only where the server offers it, page by page."""
        return [item["metadata"] for item in await self._list(path, label_selector, METADATA_LIST)]

    async def list_objects(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        """The whole objects a collection `path` (e.g. /api/v1/namespaces/ns/pods) holds now, page by page."""
        return await self._list(path, label_selector, "application/json")

    async def _list(self, path: str, label_selector: str | None, accept: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            query: list[tuple[str, Any]] = [("limit", LIST_PAGE)]
            if label_selector:
                query.append(("labelSelector", label_selector))
            if token:
                query.append(("continue", token))
            call = self.api.call_api(
                path,
                "GET",
                query_params=query,
                header_params={"Accept": accept},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=self.timeout,
            )
            status, text = await self._send("list", path, call)
            if status >= 300:
                raise ApiError(status, "list", path, text)
            page = json.loads(text)
            found += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return found

    async def version(self) -> dict[str, Any] | None:
        """The API server's `GET /version` (gitVersion, major, minor), or None where it does not answer it."""
        call = self.api.call_api(
            "/version",
            "GET",
            _preload_content=False,
            auth_settings=["BearerToken"],
            _request_timeout=self.timeout,
        )
        try:
            status, text = await self._send("get", "/version", call)
        except (ApiUnreachable, client.ApiException):
            return None
        if status != 200:
            return None
        found: dict[str, Any] = json.loads(text)
        return found

    async def serves(self, group: str, version: str, plural: str) -> bool:
        """Whether the cluster serves a resource (for optional integrations such as PodMonitor)."""
        call = self.api.call_api(
            f"/apis/{group}/{version}",
            "GET",
            _preload_content=False,
            auth_settings=["BearerToken"],
            _request_timeout=self.timeout,
        )
        try:
            status, text = await self._send("get", f"/apis/{group}/{version}", call)
        except (ApiUnreachable, client.ApiException):
            return False
        if status != 200:
            return False
        resources = json.loads(text).get("resources", [])
        return any(r.get("name") == plural for r in resources)


async def get_run(namespace: str, name: str, kubeconfig: str | None = None) -> dict[str, Any]:
    """Read one Eagle3Run with the credentials `Kube.connect_checked` finds (for the command line)."""
    kube = await Kube.connect_checked(kubeconfig=kubeconfig)
    try:
        return await kube.get_run(namespace, name)
    finally:
        await kube.close()
