"""Offline extraction's hidden states against the artifacts volume: refused only when both figures are known
and the need exceeds it (issue 29)."""

from __future__ import annotations

from eagle3_contract.api.validation import parse_spec
from eagle3_contract.estimates import TokenCount, VerifierShape, run_estimates
from eagle3_contract.storage import requested_bytes, too_small
from tests.tiny_spec import tiny

SHAPE = VerifierShape(4096, 32, "test")
TOKENS = TokenCount(204_800_000, "exact: test")


def test_the_llama_arithmetic_against_2ti_and_7ti() -> None:
    spec = parse_spec(tiny(storage={"artifacts": {"size": "2Ti"}}, extraction={"layers": [2, 16, 29]}))
    estimates = run_estimates(spec, SHAPE, TOKENS)
    assert estimates.hidden_states.offline.stored_bytes == 204_800_000 * (4 * 4096 * 2 + 8)
    assert requested_bytes(spec) == 2 * 2**40
    message = too_small(spec, estimates, requested_bytes(spec), "the volume")
    assert message is not None and message.startswith("extract would store 6.7 TB of hidden states")
    assert "but the volume holds 2.2 TB" in message and "spec.storage.artifacts.size" in message
    bigger = parse_spec(tiny(storage={"artifacts": {"size": "7Ti"}}, extraction={"layers": [2, 16, 29]}))
    assert too_small(bigger, run_estimates(bigger, SHAPE, TOKENS), requested_bytes(bigger), "v") is None


def test_nothing_is_refused_online_or_with_an_unknown_figure() -> None:
    online = parse_spec(tiny(storage={"artifacts": {"size": "1Mi"}}, extraction={"mode": "online"}))
    assert too_small(online, run_estimates(online, SHAPE, TOKENS), 1, "v") is None
    offline = parse_spec(tiny(storage={"artifacts": {"size": "1Mi"}}))
    assert too_small(offline, run_estimates(offline, None, TOKENS), 1, "v") is None  # shape unknown
    assert too_small(offline, run_estimates(offline, SHAPE, TOKENS), None, "v") is None  # capacity unknown
    claimed = parse_spec(tiny(storage={"artifacts": {"claimName": "mine"}}))
    assert requested_bytes(claimed) is None  # an existing claim's size is its own, not the spec's
