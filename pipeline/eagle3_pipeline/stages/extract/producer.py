"""`eagle3 produce`: one online hidden-state producer, `vllm serve` extracting what the train stage asks for.

    eagle3 produce --spec S --artifacts A --port P [--print]

The command (eagle3_contract.online.produce_argv) is the same in the producer Deployment's pods and under
`eagle3 run`. It reads the spec as the stages do, resolves the auxiliary layers from the verifier's config
(`resolve_aux_layers`, then the last layer's id n, as extract stores them), and builds the `vllm serve`
command with the contract's one builder: the verifier's engine (tensor parallelism, `verifier.vllmArgs`),
the `extract_hidden_states` speculative method, `--max-num-batched-tokens` = `extraction.tokenBudget`, and
hs_connectors' KV transfer config for `extraction.transfer`:

- `volume`: the `file` backend (`fp8` when `extraction.dtype` is fp8) writing each sample to
  `<artifacts>/<staging_dir(train stage hash)>`, where the trainer reads and deletes it;
- `mooncake`: the `mooncake` backend, storing samples through the master at `$EAGLE3_MOONCAKE_MASTER`.

Then it replaces itself with vLLM (exec), so the pod's signals reach vLLM directly. Without an accelerator
(vLLM CPU) it adds `--enforce-eager` and the CPU hidden-states connector
(eagle3_pipeline.serving.kv_transfer). The command line is printed first (in `kubectl logs`); `--print` only
prints it. The server answers to the model name `verifier` (vllm_server.SERVED_MODEL_NAME), on every
interface.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from eagle3_contract.api.manifest import ManifestError, load_manifest
from eagle3_contract.api.spec import Eagle3RunSpec, ExtractionMode, HiddenStatesTransfer
from eagle3_contract.exit_codes import STAGE_ERROR_EXIT_CODE
from eagle3_contract.online import ENV_MOONCAKE_MASTER, staging_dir
from eagle3_contract.params import extract_tuning, verifier_ref
from eagle3_contract.stages import Stage, plan_stages
from eagle3_contract.vllm_command import hidden_states_speculative_config
from eagle3_pipeline.data.hidden_states import Layout, resolve_aux_layers
from eagle3_pipeline.data.verifier import LocalVerifier, verifier_dims
from eagle3_pipeline.runtime.context import map_mounts
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.serving.kv_transfer import cpu_connector_env, files_config, mooncake_config
from eagle3_pipeline.serving.vllm_server import (
    SERVED_MODEL_NAME,
    SERVER_ENV_DEFAULTS,
    accelerator_present,
    build_serve_argv,
    find_vllm,
)
from eagle3_pipeline.stages.extract.vllm_backend import extract_options

logger = logging.getLogger(__name__)

LISTEN_HOST = "0.0.0.0"  # a pod's Service (locally: loopback) reaches it
CONNECTOR_PREFIX = "eagle3-cpu-connector-"


def train_staging(spec: Eagle3RunSpec, artifacts: Path) -> Path:
    """Where the `volume` transfer's samples go: the train stage's staging directory on the artifacts."""
    train = next(plan for plan in plan_stages(spec) if plan.stage == Stage.TRAIN)
    return artifacts / staging_dir(train.hash)


def producer_layout(spec: Eagle3RunSpec, num_hidden_layers: int, hidden_size: int) -> Layout:
    """The layers a producer extracts (sorted auxiliary ids, then n) and their storage dtype."""
    x = spec.extraction
    aux = resolve_aux_layers(x.layers, num_hidden_layers)
    return Layout(aux, num_hidden_layers, hidden_size, x.dtype.value)


def producer_argv(
    spec: Eagle3RunSpec,
    artifacts: Path,
    port: int,
    layout: Layout,
    *,
    executable: str = "vllm",
    cpu: bool = False,
    mooncake_master: str | None = None,
) -> list[str]:
    """The producer's `vllm serve` command line (pure: no file is read or written)."""
    x = spec.extraction
    if x.mode != ExtractionMode.ONLINE:
        raise StageError("spec.extraction.mode is offline: producers serve online extraction only")
    if x.transfer == HiddenStatesTransfer.MOONCAKE:
        if not mooncake_master:
            raise StageError(
                f"extraction.transfer is mooncake, but ${ENV_MOONCAKE_MASTER} (the master's host:port) "
                "is not set"
            )
        kv_config = mooncake_config(mooncake_master, cpu=cpu)
    else:
        kv_config = files_config(layout.transfer, train_staging(spec, artifacts), cpu=cpu)
    tuning = extract_tuning(spec)
    engine = tuning.engine(verifier_ref(spec))
    return build_serve_argv(
        executable,
        replace(engine, model=map_mounts(engine.model, artifacts)),
        port=port,
        seed=tuning.seed,
        max_num_batched_tokens=x.token_budget,
        served_model_name=SERVED_MODEL_NAME,
        enforce_eager=cpu,
        host=LISTEN_HOST,
        # vLLM collects the ids sorted and deduplicated: the layout's are, and end with n (file order)
        speculative_config=hidden_states_speculative_config(layout.layer_ids),
        kv_transfer_config=kv_config,
        # rows of up to dataset.maxSequenceLength tokens, plus the one token each request generates
        options=extract_options(tuning, layout, longest_row=spec.dataset.max_sequence_length),
    )


def producer_env(env: dict[str, str], *, cpu: bool) -> dict[str, str]:
    """vLLM's environment: the stage servers' defaults, and on vLLM CPU the CPU connector's PYTHONPATH (a
    directory of its own, which outlives this process: vLLM replaces it)."""
    out = dict(env)
    for key, value in SERVER_ENV_DEFAULTS.items():
        out.setdefault(key, value)
    if cpu:
        out.update(cpu_connector_env(Path(tempfile.mkdtemp(prefix=CONNECTOR_PREFIX)), out))
    return out


def command(spec: Eagle3RunSpec, root: Path, port: int, *, dry_run: bool) -> list[str]:
    """The producer's command line for `spec`, reading the verifier's config."""
    v = spec.verifier
    shape = verifier_dims(LocalVerifier(map_mounts(v.model, root), v.revision, v.trust_remote_code))
    try:
        executable = find_vllm()
    except StageError:
        if not dry_run:
            raise
        executable = "vllm"
    return producer_argv(
        spec,
        root,
        port,
        producer_layout(spec, shape.num_hidden_layers, shape.hidden_size),
        executable=executable,
        cpu=not accelerator_present(),
        mooncake_master=os.environ.get(ENV_MOONCAKE_MASTER),
    )


def main(spec_path: str, artifacts: str, port: int, *, dry_run: bool = False) -> int:
    """Print the producer's command line, then (unless `dry_run`) exec it; 1 with a message on bad input."""
    root = Path(artifacts).resolve()
    try:
        spec = load_manifest(spec_path).spec
        argv = command(spec, root, port, dry_run=dry_run)
    except (ManifestError, StageError) as exc:
        sys.stderr.write(f"error: produce: {exc}\n")
        return STAGE_ERROR_EXIT_CODE
    sys.stdout.write(shlex.join(argv) + "\n")
    sys.stdout.flush()
    if dry_run:
        return 0
    if spec.extraction.transfer == HiddenStatesTransfer.VOLUME:
        train_staging(spec, root).mkdir(parents=True, exist_ok=True)
    cpu = not accelerator_present()
    logger.info("produce: exec vLLM%s", " (CPU: the CPU hidden-states connector)" if cpu else "")
    sys.stderr.flush()
    os.execvpe(argv[0], argv, producer_env(dict(os.environ), cpu=cpu))
