"""Kubernetes Events on a run (`kubectl describe e3r` shows its history), from what a reconcile planned:
its phase changed, a pod of it stopped running for a new reason, a stage succeeded or train completed an
epoch (news.py), the canary's verdicts."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

import kopf

from eagle3_contract.api.status import ConditionType, RunPhase
from eagle3_operator.reconcile.canary import canary_news
from eagle3_operator.reconcile.news import BELOW_RESTRICTED, pod_security_news, progress_news
from eagle3_operator.reconcile.planner import Plan
from eagle3_operator.reconcile.run_report import blocked_pods

logger = logging.getLogger(__name__)


def announce(body: Mapping[str, Any], plan: Plan) -> None:
    """Kubernetes Events on the run (`kubectl describe e3r` shows the history): its phase changed, a pod
    of it stopped running for a new reason, a stage succeeded or train completed an epoch (news.py)."""
    try:
        _post_events(body, plan)
    except LookupError:  # outside kopf's handler context (no event queue): the log says it instead
        meta = body["metadata"]
        logger.info("%s/%s is %s (no Event posted)", meta["namespace"], meta["name"], plan.phase.value)


def _post_events(body: Mapping[str, Any], plan: Plan) -> None:
    target = kopf.Body(cast(kopf.RawBody, dict(body)))
    known = plan.previous  # the status as last written, read once by the planner
    before = blocked_pods(known)
    for stage, why in blocked_pods(plan.status).items():
        earlier = before.get(stage)
        if earlier is None or earlier.reason != why.reason:
            kopf.warn(target, reason="PodNotRunning", message=f"stage {stage}: {why.message}"[:1000])
    for reason, message in progress_news(known, plan.status, dict(plan.finished)):
        kopf.info(target, reason=reason, message=message[:1000])
    if (security := pod_security_news(known, plan.status)) is not None:
        kopf.warn(target, reason=BELOW_RESTRICTED, message=security[:1000])
    for warning, reason, message in canary_news(known, plan.status):
        (kopf.warn if warning else kopf.info)(target, reason=reason, message=message[:1000])
    if "phase" in known.model_fields_set and known.phase == plan.phase:
        return
    failed = next((c for c in plan.status.conditions if c.type == ConditionType.FAILED), None)
    valid = next((c for c in plan.status.conditions if c.type == ConditionType.SPEC_VALID), None)
    if plan.phase == RunPhase.INVALID and valid is not None and valid.status == "False":
        detail = valid.message  # what is wrong, and where (a spec's field, or the object the server refused)
    elif failed is not None and failed.status == "True":
        detail = failed.message
    else:
        detail = plan.status.current_stage or ""
    if plan.phase in (RunPhase.FAILED, RunPhase.INVALID):
        kopf.warn(target, reason=plan.phase.value, message=detail[:1000])
    else:
        kopf.info(target, reason=plan.phase.value, message=f"stage {detail}" if detail else "")
