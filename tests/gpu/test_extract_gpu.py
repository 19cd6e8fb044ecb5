"""The extract stage on a GPU (bf16 weights and compute) against a CPU extraction (fp32) of the same rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle3_pipeline.data.hidden_states import HIDDEN_STATES, TOKEN_IDS, Layout, file_name
from eagle3_pipeline.data.verifier import LocalVerifier
from eagle3_pipeline.stage_main import run_stage
from eagle3_pipeline.stages.extract.rows import PreparedRows
from eagle3_pipeline.stages.extract.transformers_backend import TransformersExtractor, load_verifier
from tests.gpu.gpu_support import AUX_LAYERS, require_cuda, tiny_manifest
from tests.pipeline.draft_support import VERIFIER

require_cuda()
pytestmark = pytest.mark.gpu

ROWS = 48
# bf16 against fp32 through the tiny verifier's 4 layers: on a CPU, bf16 runs differ by 0.4-0.7% per layer
# (relative norm), at most 2% for one token, cosine >= 0.9998; the bounds leave a margin of about 4x.
MAX_LAYER_ERROR, MAX_TOKEN_ERROR, MIN_COSINE = 0.025, 0.08, 0.999


@pytest.fixture(scope="module")
def artifacts(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("extract-gpu")
    spec = tiny_manifest(tiny_models, root / "run.yaml", ROWS)
    art = root / "art"
    assert run_stage("prepare", spec, str(art), "prepare/p", []) == 0
    assert run_stage("extract", spec, str(art), "extract/x", ["prepare=prepare/p"]) == 0
    return art


@pytest.mark.timeout(600)
def test_gpu_hidden_states_match_the_cpu_extraction_within_bf16_tolerance(
    tiny_models: Path, artifacts: Path
) -> None:
    metadata = json.loads((artifacts / "extract" / "x" / "metadata.json").read_text())
    layout = Layout(tuple(AUX_LAYERS), metadata["numHiddenLayers"], metadata["hiddenSize"], "bfloat16")
    rows = PreparedRows.load(artifacts / "prepare" / "p")
    cpu = load_verifier(LocalVerifier(str(tiny_models / VERIFIER), None, False), torch.device("cpu"))
    extractor = TransformersExtractor(cpu, layout)
    assert next(cpu.parameters()).dtype == torch.float32
    for index in range(len(rows)):
        [ids] = rows.token_ids([index])
        expected = extractor.forward([ids])[0].float()  # [T, L, H]
        stored = load_file(str(artifacts / "extract" / "x" / file_name(index)))
        assert torch.equal(stored[TOKEN_IDS], torch.tensor(ids))
        got = stored[HIDDEN_STATES].float()
        assert got.shape == expected.shape == (len(ids), layout.num_layers, layout.hidden_size)
        diff = got - expected
        layer_error = diff.norm(dim=(0, 2)) / expected.norm(dim=(0, 2))
        token_error = diff.norm(dim=-1) / expected.norm(dim=-1)
        cosine = torch.nn.functional.cosine_similarity(got, expected, dim=-1)
        assert layer_error.max() < MAX_LAYER_ERROR, (index, layer_error.tolist())
        assert token_error.max() < MAX_TOKEN_ERROR, (index, token_error.max().item())
        assert cosine.min() > MIN_COSINE, (index, cosine.min().item())
