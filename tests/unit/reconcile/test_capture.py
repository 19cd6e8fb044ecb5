"""serving.capture's ConfigMap: created before the Deployment whose pods mount it, patched when the package
changes (an operator upgrade), deleted when capture is turned off or serving is, and never taken for a stale
spec ConfigMap."""

from __future__ import annotations

from typing import Any

import pytest

from eagle3_operator.builders import capture, names
from tests.unit.reconcile.planner_world import RUN, World, keys, tiny

CM = names.capture_configmap_name(RUN.name)
VLLM = names.serving_name(RUN.name)
CAPTURE = {"capture": {"sampleRate": 0.5, "maxBytes": "1Gi", "retention": "24h"}}


def serving_world(**serving: Any) -> World:
    world = World(tiny(serving=serving))
    world.run_to("none")
    return world


def test_the_configmap_is_created_before_the_deployment_that_mounts_it() -> None:
    world = World(tiny(serving=CAPTURE))
    plan = world.run_to("none")
    assert world.deployment is not None and ("ConfigMap", CM) in world.objects
    steps = [k for k in keys(plan) if k[1] in ("ConfigMap", "Deployment") and k[2] in (CM, VLLM)]
    assert steps == [("create", "ConfigMap", CM), ("create", "Deployment", VLLM)], keys(plan)
    template = world.deployment["spec"]["template"]
    assert template["metadata"]["annotations"][capture.ANNOTATION_CAPTURE] == capture.capture_hash()
    assert world.step().actions == ()


def test_turning_capture_on_rolls_the_pods_and_off_deletes_the_configmap() -> None:
    world = serving_world()
    assert ("ConfigMap", CM) not in world.objects
    world.edit(serving=CAPTURE)
    assert keys(world.step()) == [("create", "ConfigMap", CM), ("patch", "Deployment", VLLM)]
    world.spec["serving"].pop("capture")  # the field removed from the manifest
    world.edit()
    # the pods stop mounting it first: an old pod restarted during the rollout still finds it
    assert keys(world.step()) == [("patch", "Deployment", VLLM), ("delete", "ConfigMap", CM)]
    assert ("ConfigMap", CM) not in world.objects and world.step().actions == ()


def test_a_new_package_patches_the_configmap_and_rolls_the_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    world = serving_world(**CAPTURE)
    sources = capture.capture_sources()
    monkeypatch.setattr(
        capture, "_read_sources", lambda: sources | {"config.py": sources["config.py"] + "\n"}
    )
    capture.capture_hash.cache_clear()  # an operator upgrade: a new process, nothing read yet
    try:
        assert keys(world.step()) == [("patch", "ConfigMap", CM), ("patch", "Deployment", VLLM)]
        assert world.step().actions == ()
    finally:
        capture.capture_hash.cache_clear()


def test_disabling_serving_deletes_it_and_no_spec_edit_takes_it_for_stale() -> None:
    world = serving_world(**CAPTURE)
    world.edit(training={"epochs": 2}, serving=CAPTURE)  # a new spec ConfigMap; older ones are deleted
    world.step()
    assert ("ConfigMap", CM) in world.objects
    world.edit(serving={"enabled": False})
    plan = world.step()
    assert ("delete", "ConfigMap", CM) in keys(plan) and ("delete", "Deployment", VLLM) in keys(plan)
