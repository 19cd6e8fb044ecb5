"""Every field vLLM reads from a draft's config is one the checkpoint must state (issue 31; speculators #1065,
vLLM #54526: drafts whose norm fields were dropped and vLLM's defaults taken).

vLLM converts a speculators checkpoint's config.json with one function per draft type
(`vllm/transformers_utils/configs/speculators/algos.py`), reading each field with a default of its own
where it is absent. The contract lists those fields per method (`MethodRow.vllm_reads`) and the serving
checkpoint writer refuses a config that leaves one out. Here vLLM's own converters run, in vLLM's own
environment, on a config that records what they read: the list must hold every field they read.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from eagle3_contract.draft_methods import METHODS
from eagle3_pipeline.data.draft_checkpoint import unstated_fields, write_serving_checkpoint
from eagle3_pipeline.runtime.errors import StageError
from tests.pipeline.draft_support import shared_draft

pytestmark = pytest.mark.pipeline

# Read only when set (vLLM copies target_hidden_size when it is not None): absent and null are the same.
READ_WHEN_SET = {"target_hidden_size"}

RECORDING = r"""
import json, sys
from vllm.transformers_utils.configs.speculators.algos import SUPPORTED_SPECULATORS_TYPES

class Recording(dict):
    # answers every field, and remembers which were asked for
    def __init__(self):
        super().__init__()
        self.read = set()
    def _value(self, key):
        self.read.add(key)
        return [1, 2, 3] if key.endswith("_ids") else 1
    def get(self, key, default=None):
        return self._value(key)
    def __getitem__(self, key):
        return self._value(key)
    def __contains__(self, key):
        self.read.add(key)
        return True

out = {}
for kind in sys.argv[1:]:
    config = Recording()
    SUPPORTED_SPECULATORS_TYPES[kind](config, {"model_type": "llama"})
    out[kind] = sorted(config.read)
print(json.dumps(out))
"""


@pytest.mark.vllm
@pytest.mark.timeout(300)
def test_the_contract_lists_every_field_vllms_converters_read() -> None:
    from tests.pipeline.test_vllm_server import vllm_or_skip

    python = Path(vllm_or_skip()).parent / "python"
    kinds = [row.speculators_type for row in METHODS.values()]
    done = subprocess.run(
        [str(python), "-c", RECORDING, *kinds], capture_output=True, text=True, check=False, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    read = json.loads(done.stdout.strip().splitlines()[-1])
    for row in METHODS.values():
        wanted = set(read[row.speculators_type]) - READ_WHEN_SET
        assert wanted <= set(row.vllm_reads), (row.method, sorted(wanted - set(row.vllm_reads)))
        assert set(row.vllm_reads) <= wanted, (row.method, "listed but not read by vLLM")


def test_a_checkpoint_that_leaves_out_a_field_vllm_reads_is_refused(
    tmp_path: Path, tiny_models: Path
) -> None:
    draft = shared_draft(tiny_models, tmp_path.parent, fitted=False)
    config = json.loads((draft / "config.json").read_text())
    assert unstated_fields(config) == []  # speculators 0.9 writes them all
    dropped = tmp_path / "dropped"
    dropped.mkdir()
    (dropped / "model.safetensors").symlink_to(draft / "model.safetensors")
    del config["norm_before_residual"]
    (dropped / "config.json").write_text(json.dumps(config))
    with pytest.raises(StageError, match=r"does not state norm_before_residual: vLLM would load"):
        write_serving_checkpoint(dropped, tmp_path / "slim", "/models/tiny-llama")
    assert not (tmp_path / "slim").exists()  # nothing written
