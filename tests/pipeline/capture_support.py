"""A vLLM CPU server of the tiny verifier with a fitted draft, capturing as a serving pod does (or not): the
capture package mounted by name on PYTHONPATH and the Deployment's own `vllm serve` arguments."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import eagle3_contract.capture as package
from eagle3_contract.api.spec import Eagle3RunSpec
from eagle3_contract.capture.config import PACKAGE
from eagle3_contract.stages import Stage
from eagle3_contract.vllm_command import VllmEngine, draft_speculative_config
from eagle3_operator.builders.capture import capture_args
from eagle3_pipeline.data.draft_checkpoint import write_serving_checkpoint
from eagle3_pipeline.runtime.context import StageContext
from eagle3_pipeline.serving.vllm_server import VllmServer
from tests.pipeline.draft_support import evaluate_spec, shared_draft

SPEC = Eagle3RunSpec.model_validate(evaluate_spec())
MODEL = SPEC.verifier.model
NUM_SPECULATIVE_TOKENS = 3


def mount(root: Path) -> Path:
    """The package as the pod has it: its modules under <root>/eagle3_capture, <root> on PYTHONPATH."""
    target = root / PACKAGE
    target.mkdir(parents=True, exist_ok=True)
    for module in Path(package.__file__).parent.glob("*.py"):
        shutil.copy(module, target / module.name)
    return root


def serving_draft(models: Path, base: Path, work: Path) -> Path:
    """The session's fitted draft as a serving checkpoint (what export writes)."""
    return write_serving_checkpoint(shared_draft(models, base), work / "draft", MODEL).path


def server(
    name: str,
    draft: Path,
    work: Path,
    capture: Path | None,
    segment_seconds: float = 30.0,
    extra_args: Sequence[str] = (),
) -> VllmServer:
    """`name`'s server; with `capture` (the directory), recording every request there."""
    ctx = StageContext.of_spec(Stage.EVALUATE, name, SPEC, work / "artifacts", work / name)
    env: dict[str, str] = {"OMP_NUM_THREADS": "1"}
    if capture is not None:
        env |= {
            "PYTHONPATH": str(mount(work / "python")),
            "EAGLE3_CAPTURE_DIR": str(capture),
            "EAGLE3_CAPTURE_SOURCE": name,
            "EAGLE3_CAPTURE_SAMPLE_RATE": "1",
            "EAGLE3_CAPTURE_SEGMENT_SECONDS": str(segment_seconds),
        }
    return VllmServer(
        ctx,
        VllmEngine.of(SPEC.verifier),
        seed=SPEC.dataset.seed,
        speculative_config=draft_speculative_config(str(draft), NUM_SPECULATIVE_TOKENS),
        extra_args=[*extra_args, *(capture_args() if capture is not None else [])],
        served_model_name=MODEL,
        startup_timeout_s=600.0,
        log_path=work / f"vllm-{name}.log",
        env=env,
    )
