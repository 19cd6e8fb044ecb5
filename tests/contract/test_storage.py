"""Offline extraction's hidden states against the artifacts volume: refused only when both figures are known
and the need exceeds it (issue 29)."""

from __future__ import annotations

from eagle3_contract.api.validation import parse_spec
from eagle3_contract.estimates import TokenCount, VerifierShape, run_estimates
from eagle3_contract.storage import claim_too_small, disk_too_small, requested_bytes
from tests.tiny_spec import tiny

SHAPE = VerifierShape(4096, 32, "test")
TOKENS = TokenCount(204_800_000, "exact: test")


def test_the_llama_arithmetic_against_2ti_and_7ti() -> None:
    spec = parse_spec(tiny(storage={"artifacts": {"size": "2Ti"}}, extraction={"layers": [2, 16, 29]}))
    estimates = run_estimates(spec, SHAPE, TOKENS)
    assert estimates.hidden_states.offline.stored_bytes == 204_800_000 * (4 * 4096 * 2 + 8)
    assert requested_bytes(spec) == 2 * 2**40
    message = claim_too_small(spec, estimates)
    assert message is not None and message.startswith("extract would store 6.7 TB of hidden states")
    assert "but the artifacts volume (spec.storage.artifacts.size 2Ti) holds 2.2 TB" in message
    # what to set: the need in whole Gi (6,712,524,800,000 B = 6,251.5 GiB), and how a created claim grows
    assert "set spec.storage.artifacts.size to at least 6252Gi" in message and "kubectl patch pvc" in message
    bigger = parse_spec(tiny(storage={"artifacts": {"size": "7Ti"}}, extraction={"layers": [2, 16, 29]}))
    assert claim_too_small(bigger, run_estimates(bigger, SHAPE, TOKENS)) is None


def test_a_local_disk_is_advised_as_a_disk_not_a_claim() -> None:
    """Issue 42, item 7: `eagle3 run`'s refusal spoke of `kubectl patch pvc` and the claim's size."""
    spec = parse_spec(tiny(extraction={"layers": [2, 16, 29]}))
    estimates = run_estimates(spec, SHAPE, TOKENS)
    message = disk_too_small(spec, estimates, 10**12, "/data/art")
    assert message is not None and message.startswith("extract would store 6.7 TB of hidden states")
    assert (
        "but the free space under /data/art holds 1.0 TB: free 5.7 TB more on that disk, or give --artifacts "
        "a directory on a disk with 6.7 TB free; or lower dataset.maxSamples"
    ) in message
    assert "kubectl" not in message and "spec.storage.artifacts.size" not in message
    assert disk_too_small(spec, estimates, 7 * 10**12, "/data/art") is None


def test_nothing_is_refused_online_or_with_an_unknown_figure() -> None:
    online = parse_spec(tiny(storage={"artifacts": {"size": "1Mi"}}, extraction={"mode": "online"}))
    assert claim_too_small(online, run_estimates(online, SHAPE, TOKENS)) is None
    assert disk_too_small(online, run_estimates(online, SHAPE, TOKENS), 1, "d") is None
    offline = parse_spec(tiny(storage={"artifacts": {"size": "1Mi"}}))
    assert claim_too_small(offline, run_estimates(offline, None, TOKENS)) is None  # shape unknown
    assert disk_too_small(offline, run_estimates(offline, None, TOKENS), 1, "d") is None
    claimed = parse_spec(tiny(storage={"artifacts": {"claimName": "mine"}}))
    assert requested_bytes(claimed) is None  # an existing claim's size is its own, not the spec's
    assert claim_too_small(claimed, run_estimates(claimed, SHAPE, TOKENS)) is None  # capacity unknown
