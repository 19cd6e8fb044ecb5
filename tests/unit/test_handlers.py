"""The kopf wiring's promises that the rest of the operator relies on (eagle3_operator.handlers)."""

from __future__ import annotations

import logging
from pathlib import Path

import kopf
import pytest

from eagle3_operator import handlers, operator_main
from tests.patch_guards import another_version, check_both_directions


def test_the_operator_has_no_create_update_or_daemon_handlers_so_no_diff_base_is_needed():
    """NoDiffBase builds no diff base: only kopf's create/update/delete handlers and its daemons and timers
    read one. Adding such a handler would need kopf's own storage back (and would put kopf's bookkeeping in
    the run's status and a finalizer on it)."""
    registry = kopf.get_default_registry()
    assert not registry._changing.get_all_handlers(), "create/update/resume/delete handlers"
    assert not registry._spawning.get_all_handlers(), "daemons and timers"
    assert handlers.NoDiffBase().build(body=kopf.Body({"spec": {"a": 1}, "status": {}})) == {}


def test_every_watched_kind_is_watched_through_event_handlers_and_indexes_only():
    registry = kopf.get_default_registry()
    selectors = [h.selector for h in registry._watching.get_all_handlers()]
    watched = {(s.group, s.plural or s.any_name) for s in selectors}
    assert ("eagle3.dev", "eagle3runs") in watched, "a run's own events reconcile it (run_event)"
    assert {("batch", "jobs"), ("", "pods"), ("apps", "deployments")} <= watched


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, message, None, None)


def test_kopfs_line_per_event_handler_success_is_dropped_and_the_rest_is_kept():
    quiet = handlers.EVENT_HANDLER_SUCCESS
    assert not quiet.filter(_record("Handler 'child_changed' succeeded."))
    assert not quiet.filter(_record("Handler 'run_event' succeeded."))
    assert quiet.filter(_record("Handler 'child_changed' failed with an exception. Will ignore."))
    assert quiet.filter(_record("create Job tiny-prepare-0123456789ab"))


def test_kopfs_context_variables_are_where_the_handlers_reuse_them_and_another_kopf_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    check_both_directions(monkeypatch, tmp_path, handlers.EVENT_CONTEXT_GUARD)


def test_another_kopf_stops_the_operator_before_it_connects_with_one_log_record(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def connect(total_seconds: float) -> None:
        raise AssertionError("the operator connected with a kopf it was not verified against")

    monkeypatch.setattr(operator_main, "connect", connect)
    another_version(monkeypatch, handlers.EVENT_CONTEXT_GUARD)
    with pytest.raises(SystemExit) as exited:
        operator_main.run_operator([], liveness=None, metrics_port=None)
    assert exited.value.code == 1
    [record] = [r for r in caplog.records if r.name == operator_main.__name__]
    assert record.getMessage().startswith(
        "eagle3 operator: eagle3_operator.handlers patches the internals of kopf as kopf==1.45.2 writes them"
    )
