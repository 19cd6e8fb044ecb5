"""Where a stage's pod (and a vLLM pod) finds things: the same paths in a container and, mapped, locally."""

from __future__ import annotations

# The run document (the Eagle3Run's spec, as JSON), from the run's spec ConfigMap.
SPEC_MOUNT = "/etc/eagle3/run.json"
# The artifacts volume: stage outputs at <stage>/<hash>.
ARTIFACTS_MOUNT = "/artifacts"
# The model cache volume (Hugging Face cache and local model directories).
MODEL_CACHE_MOUNT = "/models"
HF_HOME = f"{MODEL_CACHE_MOUNT}/hf"
# serving.capture: the directory on the artifacts volume that the vLLM pods record live requests to.
CAPTURE_DIR = "capture"
# The draft's weights file in an exported (or pinned) draft directory: what the sha256 covers.
DRAFT_WEIGHTS = "model.safetensors"


def draft_path(draft_dir: str) -> str:
    """The draft's directory in a container: absolute as given, else relative to the artifacts mount."""
    return draft_dir if draft_dir.startswith("/") else f"{ARTIFACTS_MOUNT}/{draft_dir}"
