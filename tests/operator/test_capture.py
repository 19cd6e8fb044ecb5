"""serving.capture through the operator (API mock and real API server): the package's ConfigMap made once
with the Deployment that mounts it, kept through reconciles (never taken for a stale spec ConfigMap), and
deleted when the manifest drops capture."""

from __future__ import annotations

from typing import Any

from eagle3_operator.builders import capture, names
from tests.harness.cluster import eventually
from tests.harness.scenario import drive_to_serving, tiny

CM = names.capture_configmap_name("tiny")
CAPTURE = {"sampleRate": 0.5, "maxBytes": "1Gi", "retention": "24h"}


async def _configmap(cluster: Any) -> dict[str, Any] | None:
    found = [c for c in await cluster.list_objects("v1", "configmaps") if c["metadata"]["name"] == CM]
    return found[0] if found else None


async def test_the_package_is_mounted_from_its_configmap_until_capture_is_dropped(backend):
    cluster, player = backend.cluster, backend.player
    async with backend.operator():
        await cluster.apply_run("tiny", tiny(serving={"capture": CAPTURE}))
        await drive_to_serving(cluster, player, "tiny")
        configmap = await eventually(lambda: _configmap(cluster), what="the capture ConfigMap")
        deployment = await cluster.deployment("tiny")
        assert configmap["data"] == capture.capture_sources()
        assert configmap["metadata"]["ownerReferences"][0]["name"] == "tiny"
        pod = deployment["spec"]["template"]["spec"]
        [volume] = [v for v in pod["volumes"] if v["name"] == capture.VOLUME_CODE]
        assert volume["configMap"]["name"] == CM
        assert [i["key"] for i in volume["configMap"]["items"]] == sorted(configmap["data"])
        created = configmap["metadata"]["uid"]
        await cluster.edit_run("tiny", {"serving": {"replicas": 2}})  # more reconciles, a new spec ConfigMap
        await eventually(lambda: _replicas(cluster, 2), what="the replicas edit reconciled")
        kept = await _configmap(cluster)
        assert kept is not None and kept["metadata"]["uid"] == created, "kept, not re-made"
        await cluster.edit_run("tiny", {"serving": {"capture": None}})
        await eventually(lambda: _gone(cluster), what="the capture ConfigMap deleted")
        deployment = await cluster.deployment("tiny")
    # patched before the ConfigMap went (an old pod restarted mid-rollout still finds its package)
    assert "--middleware" not in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


async def _replicas(cluster: Any, replicas: int) -> bool:
    deployment = await cluster.deployment("tiny")
    return deployment is not None and deployment["spec"]["replicas"] == replicas


async def _gone(cluster: Any) -> bool:
    return await _configmap(cluster) is None
