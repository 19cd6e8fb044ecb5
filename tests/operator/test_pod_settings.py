"""spec.pod and the serving PodDisruptionBudget through the real kopf operator on each backend."""

from __future__ import annotations

import pytest

from tests.harness.cluster import eventually
from tests.harness.scenario import drive_to_serving, status, tiny, wait_job

pytestmark = pytest.mark.operator

POD = {
    "serviceAccountName": "default",
    "imagePullSecrets": [{"name": "registry-creds"}],
    "labels": {"team": "ml"},
    "env": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
}


async def test_a_stage_job_carries_the_pod_settings_and_the_restricted_defaults(backend):
    cluster = backend.cluster
    async with backend.operator():
        await cluster.apply_run("tiny", tiny(pod=POD))
        job = await wait_job(cluster, "tiny", "prepare")
    template = job["spec"]["template"]
    pod = template["spec"]
    assert pod["serviceAccountName"] == "default"
    assert pod["imagePullSecrets"] == [{"name": "registry-creds"}]
    assert template["metadata"]["labels"]["team"] == "ml"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [container] = pod["containers"]
    assert container["env"][-1] == {"name": "HTTPS_PROXY", "value": "http://proxy:3128"}
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False


ESCALATING = {"containerSecurityContext": {"allowPrivilegeEscalation": True}}  # "baseline", not "restricted"


async def test_a_run_below_the_operators_pod_security_floor_is_refused_naming_the_field(backend):
    """Issue 42 item 5: the operator's service account creates the run's pods, so by default a spec.pod
    below "restricted" is refused before anything is created (it was only warned)."""
    cluster = backend.cluster
    async with backend.operator():
        await cluster.apply_run("tiny", tiny(pod=ESCALATING))

        async def refused():
            st = await status(cluster, "tiny")
            found = [
                c for c in st.get("conditions", []) if c["type"] == "SpecValid" and c["status"] == "False"
            ]
            return found[0] if found else None

        cond = await eventually(refused, what="SpecValid False")
        assert not await cluster.jobs("tiny", "prepare"), "nothing is created for a refused run"
    assert cond["reason"] == "InvalidSpec"
    assert "below this operator's minimum 'restricted'" in cond["message"]
    assert "spec.pod.containerSecurityContext.allowPrivilegeEscalation: must be false" in cond["message"]
    assert "podSecurity.minimumLevel" in cond["message"]


async def test_a_run_below_restricted_under_a_lowered_floor_is_warned_and_its_condition_names_the_field(
    backend,
):
    """Issue 28 item 8: where a cluster admin lowered the floor to "baseline", a container allowed to escalate
    its privileges is built as asked, with every other restricted default kept, and the run says so: a
    Warning Event and the PodSecurity condition, once. (`privileged: true` would need the floor at
    "privileged", and an API server without --allow-privileged refuses its Job.)"""
    cluster = backend.cluster
    async with backend.operator(pod_security_minimum_level="baseline"):
        await cluster.apply_run("tiny", tiny(pod=ESCALATING))
        job = await wait_job(cluster, "tiny", "prepare")
        event = await eventually(lambda: _warning(cluster, "PodSecurityBelowRestricted"), what="the Warning")

        async def condition():
            st = await status(cluster, "tiny")
            found = [c for c in st.get("conditions", []) if c["type"] == "PodSecurity"]
            return found[0] if found else None

        cond = await eventually(condition, what="the PodSecurity condition")
        events = [e for e in await cluster.list_objects("v1", "events") if e.get("reason") == event["reason"]]
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert cond["status"] == "False" and cond["reason"] == "BelowRestricted"
    field = "spec.pod.containerSecurityContext.allowPrivilegeEscalation: must be false"
    assert field in cond["message"] and field in event["message"]
    assert sum(e.get("count", 1) for e in events) == 1, "one Warning, not one per reconcile"


async def _warning(cluster, reason):
    events = await cluster.list_objects("v1", "events")
    found = [e for e in events if e.get("type") == "Warning" and e.get("reason") == reason]
    return found[0] if found else None


async def serves_policy_v1(cluster) -> bool:
    """Whether the cluster serves policy/v1 (Kubernetes 1.21+; the mock does, the 1.20 test server not)."""
    url = f"{cluster.url}/apis/policy/v1"
    async with cluster.session.get(url, headers=cluster.headers, ssl=False) as resp:
        return resp.status == 200


async def test_serving_gets_a_disruption_budget_where_the_cluster_serves_policy_v1(backend):
    cluster, player = backend.cluster, backend.player
    served = await serves_policy_v1(cluster)
    assert served or backend.real, "the mock serves policy/v1: the budget must be checked there"
    async with backend.operator():
        await cluster.apply_run("tiny", tiny(serving={"disruptionBudget": {"maxUnavailable": "50%"}}))
        await drive_to_serving(cluster, player, "tiny")
        if not served:
            # serving goes on without a budget, and the operator asks for none
            assert await cluster.list_objects("policy/v1beta1", "poddisruptionbudgets") == []
            return
        pdb = await eventually(
            lambda: cluster.get("policy/v1", "poddisruptionbudgets", "tiny-vllm"), what="the vLLM PDB"
        )
    assert pdb["spec"]["maxUnavailable"] == "50%"
    assert pdb["spec"]["selector"]["matchLabels"] == {"eagle3.dev/run": "tiny", "eagle3.dev/stage": "serve"}
    assert pdb["metadata"]["ownerReferences"][0]["kind"] == "Eagle3Run"
