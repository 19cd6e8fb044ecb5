"""The Eagle3Run API: pydantic models that generate the CRD and that every component reads."""

from __future__ import annotations

from eagle3_contract.api.base import API_VERSION, GROUP, KIND, PLURAL, VERSION
from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.api.status import Eagle3RunStatus, RunPhase, StagePhase
from eagle3_contract.api.validation import InvalidSpecError, parse_spec, spec_document

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "Eagle3RunSpec",
    "Eagle3RunStatus",
    "InvalidSpecError",
    "RunPhase",
    "StagePhase",
    "parse_spec",
    "spec_document",
]
