"""`eagle3 stage train`: the EAGLE-3 draft, trained with speculators on extract's hidden states.

Inputs: the data stage (`prepare` or `generate`: the dataset, loss masks and train/validation split),
`extract` (hidden states and the layers they hold) and `vocab` (d2t/t2d). Without an accelerator it trains
on the CPU (`eagle3_pipeline.adapters.speculators_cpu`); with `training.gpus` > 1 it runs torchrun with one
process per GPU (`eagle3_pipeline.stages.train.draft`), or with nodePool.device cpu training.gpus CPU
processes (gloo); with `training.nodes` > 1 this program is node 0 of a multi-node torchrun, and the other
nodes run it in worker mode (`run_worker`, `eagle3_pipeline.stages.train.nodes`).

Output (`train/<hash>/`), what the export and evaluate stages read:
  checkpoints/checkpoint_best -> <e>   speculators' symlink to the epoch with the lowest validation loss:
                                       `config.json` (Eagle3SpeculatorConfig, architectures Eagle3DraftModel,
                                       the verifier's local path, eagle_aux_hidden_state_layer_ids) and
                                       `model.safetensors` (bf16: the draft's weights, d2t, t2d, a frozen copy
                                       of the verifier's embeddings); the result's `checkpoint` is this path
  checkpoints/<e>/                     every epoch as speculators writes it: the same two files plus
                                       optimizer_state_dict.pt, scheduler_state_dict.pt, training_state.json
                                       (and val_metrics.json in the best one); `epoch<e>_end` link to them
  checkpoints/run.yaml                 speculators' TrainConfig (`speculators train --config` re-runs it)
  metrics.jsonl                        one line per epoch (see eagle3_pipeline.stages.train.metrics)
  trainer.json                         trainable parameters, device, world size, the last start epoch
  result.json                          the per-epoch figures, the best epoch and its per-position accuracy

With draft.candidates, each method is trained in turn (the same inputs, draft.method set to it) into
`candidates/<method>/` with the layout above; the result lists each one's best checkpoint and figures in
`candidates`, and its other figures and `checkpoint` are draft.method's. Evaluate chooses among them.

Progress (ctx.progress): optimizer steps of epochs x steps per epoch, the epochs done, the recent loss and
tokens/s, and each epoch's validation figures, from speculators' metric records (train_metrics); a torchrun
run's global rank 0 relays them through `progress.jsonl` in the work directory (train_progress).

Resumable: the work directory keeps checkpoints and metrics between attempts. A new attempt keeps the epochs
that are complete (a checkpoint and a metrics line), removes the rest, repairs `checkpoint_best` and lets
speculators resume after the last complete epoch with its optimizer and scheduler state.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from eagle3_contract.api.spec import Device, DraftMethod, trained_methods
from eagle3_contract.mounts import draft_path
from eagle3_contract.params import TrainParams, TrainTuning
from eagle3_contract.stages import Stage
from eagle3_pipeline.adapters.speculators_cpu import has_accelerator
from eagle3_pipeline.data.hidden_states import METADATA_FILE, file_name
from eagle3_pipeline.data.hub import verifier_at_revision
from eagle3_pipeline.data.prepared import DATA_DIR, TRAIN
from eagle3_pipeline.runtime.context import StageContext, is_complete, read_result
from eagle3_pipeline.runtime.errors import StageError
from eagle3_pipeline.stages.train.draft import (
    RUN_CONFIG_FILE,
    DraftSources,
    pin_threads,
    torchrun_argv,
    train,
    train_config,
)
from eagle3_pipeline.stages.train.events import EVENTS_FILE, relayed
from eagle3_pipeline.stages.train.metrics import (
    METRICS_FILE,
    read_epochs,
    summarize,
)
from eagle3_pipeline.stages.train.nodes import TORCHRUN_ENV, Nodes, nodes_of, wait_for_rendezvous
from eagle3_pipeline.stages.train.online import finish_online, online_environment, online_inputs
from eagle3_pipeline.stages.train.resume import BEST, keep_complete_epochs, repair_best
from eagle3_pipeline.stages.train.warm_start import starting_point

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
CANDIDATES = "candidates"  # draft.candidates: candidates/<method>/ holds each one's checkpoints and metrics
INFO_FILE = "trainer.json"

Context = StageContext[TrainParams, TrainTuning]


def run(ctx: Context) -> dict[str, Any]:
    started = time.monotonic()
    src = sources(ctx)
    methods = trained_methods(ctx.params.draft.candidates)  # train_params keeps only the trained ones
    if not methods:
        result = train_draft(ctx, ctx.params, ctx.work, src)
        seconds = round(time.monotonic() - started, 3)
        return {**finish_online(ctx), **result, "candidates": None, "seconds": seconds}
    # draft.candidates: each method in turn, from the same data, in a directory of its own
    trained = {}
    for i, method in enumerate(methods, 1):
        logger.info("train: candidate %d of %d: draft.method %s", i, len(methods), method.value)
        draft = ctx.params.draft.model_copy(update={"method": method, "candidates": None})
        work = ctx.work / CANDIDATES / method.value
        trained[method] = train_draft(ctx, ctx.params.model_copy(update={"draft": draft}), work, src)
    return {
        **trained[ctx.params.draft.method],  # draft.method's figures, as a run without candidates has them
        "candidates": [candidate_figures(m, r) for m, r in trained.items()],
        "seconds": round(time.monotonic() - started, 3),
    }


def candidate_figures(method: DraftMethod, result: dict[str, Any]) -> dict[str, Any]:
    """A candidate's line of the result's `candidates`: its method, checkpoint and key figures."""
    keys = (
        "checkpoint",
        "bestEpoch",
        "bestValLoss",
        "estimatedAcceptanceLength",
        "trainSeconds",
        "parameters",
    )
    return {"method": method.value, **{k: result[k] for k in keys}}


def train_draft(ctx: Context, params: TrainParams, work: Path, src: DraftSources) -> dict[str, Any]:
    """Train `params`' draft into `work` (resuming the complete epochs found there); its result figures, the
    checkpoint relative to the stage's output."""
    save_path, metrics = work / CHECKPOINTS, work / METRICS_FILE
    epochs = params.training.epochs
    complete = keep_complete_epochs(save_path, metrics)
    ctx.progress.train_plan(epochs, None, epochs_done=complete)  # the steps once the trainer is built
    for epoch in read_epochs(metrics)[:complete]:  # a resumed run's figures (and validation-loss trend)
        ctx.progress.train_epoch(
            epoch["epoch"] + 1,
            epoch["valLoss"],
            epoch["valAccuracyByPosition"],
            epoch["estimatedAcceptanceLength"],
        )
    on_cpu = not has_accelerator()
    warm = params.training.warm_start
    if warm is not None:  # the exported draft's directory as the pods see it (/artifacts/<path>), mapped here
        start = starting_point(warm, Path(ctx.local_path(draft_path(warm.path))), params, src, work)
    else:
        start = None
    cfg = train_config(params, src, save_path, cpu=on_cpu, warm=start.checkpoint if start else None)
    save_path.mkdir(parents=True, exist_ok=True)
    (save_path / RUN_CONFIG_FILE).write_text(cfg.dump_yaml())
    if complete < epochs:
        logger.info("train: %d of %d epochs done already; training on %s", complete, epochs, src.dataset)
        with online_environment(ctx):
            launch(ctx, cfg, src.hidden_size, work, on_cpu)
    done = read_epochs(metrics)
    if [e["epoch"] for e in done] != list(range(epochs)):
        # speculators turns SIGTERM into a normal return after saving `interrupted/` (at the end of a step:
        # adapters.speculators_interrupt): not a finished run, and nothing a traceback would explain
        raise StageError(
            f"training stopped after epochs {[e['epoch'] for e in done]} of {epochs} (interrupted?); "
            "the complete epochs are kept and the next attempt resumes after them",
            keep_work=True,
        )
    repair_best(save_path, done)
    info = json.loads((work / INFO_FILE).read_text())
    return {
        **summarize(done),
        "checkpoint": str((save_path / BEST).relative_to(ctx.work)),
        "metrics": str(metrics.relative_to(ctx.work)),
        "parameters": info["parameters"],
        "device": info["device"],
        "worldSize": info["worldSize"],
        "resumedFromEpoch": info["startEpoch"] or None,
        "trainSeconds": round(sum(e["seconds"] for e in done), 3),
        "draftVocabSize": src.vocab_size,
        "auxLayers": src.aux_layers,
        "tttSteps": params.training.ttt_steps,
        **({"warmStart": start.note} if start else {}),
    }


def launch(ctx: Context, cfg: Any, hidden_size: int, work: Path, on_cpu: bool) -> None:
    """Train in this process, or under torchrun with one process per GPU when training.gpus > 1, or as node 0
    of training.nodes (one process per GPU, or one per node on the CPU); `work` holds the checkpoints, the
    metrics and the trainer's figures."""
    import torch

    gpus = ctx.params.training.gpus
    info, metrics = work / INFO_FILE, work / METRICS_FILE
    nodes = nodes_of(ctx.params.training.nodes, ctx.output.name)
    if nodes is not None:
        run_torchrun(ctx, nodes, on_cpu)
        return
    nproc = processes(ctx, on_cpu)
    if nproc == 1:
        if gpus > 1:
            logger.warning(
                "training.gpus is %d, but there is no accelerator: training in one CPU process "
                "(with nodePool.device cpu, training.gpus CPU processes)",
                gpus,
            )
        if on_cpu:
            logger.info("train: %d torch threads", pin_threads(hidden_size))
        train(cfg, metrics, info, ctx.progress)
        return
    if not on_cpu:
        visible = int(torch.accelerator.device_count())
        if visible < gpus:
            raise StageError(  # the epochs an earlier attempt finished stay for the next one
                f"training.gpus is {gpus}, but this machine shows {visible} devices: lower training.gpus or "
                "give the train stage's pod that many GPUs",
                keep_work=True,
            )
    events = work / EVENTS_FILE
    argv = torchrun_argv(nproc, work / CHECKPOINTS / RUN_CONFIG_FILE, metrics, info, progress=events)
    logger.info("train: %s", " ".join(argv))
    with relayed(events, ctx.progress):
        code = subprocess.run(argv, env=worker_env(nproc, on_cpu), check=False).returncode
    if code != 0:
        raise RuntimeError(f"torchrun exited with code {code} (its workers' errors are above)")


def processes(ctx: Context, on_cpu: bool) -> int:
    """Training processes of this node: one per GPU; on the CPU training.gpus in CPU mode (nodePool.device
    cpu: what the spec asks for, gloo), else one (a GPU spec run on a machine without GPUs)."""
    gpus = ctx.params.training.gpus
    if not on_cpu or ctx.tuning.device is Device.CPU:
        return gpus
    return 1


def worker_env(nproc: int, on_cpu: bool) -> dict[str, str]:
    """torchrun's environment: on the CPU each of `nproc` workers gets its share of this pod's CPUs as its
    threads (torchrun would give each one), unless $OMP_NUM_THREADS is set."""
    env = dict(os.environ)
    if on_cpu and nproc > 1 and not env.get("OMP_NUM_THREADS"):
        env["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // nproc))
    return env


def run_torchrun(ctx: Context, nodes: Nodes, on_cpu: bool) -> None:
    """This node's torchrun of a multi-node run: the same command on every node but for its rank."""
    import torch

    gpus = ctx.params.training.gpus
    if not on_cpu and int(torch.accelerator.device_count()) < gpus:
        raise StageError(
            f"training.gpus is {gpus}, but node {nodes.rank} shows {torch.accelerator.device_count()} "
            "devices: lower training.gpus or give each train pod that many GPUs",
            keep_work=True,
        )
    work = ctx.work
    nproc = processes(ctx, on_cpu)
    argv = torchrun_argv(
        nproc,
        work / CHECKPOINTS / RUN_CONFIG_FILE,
        work / METRICS_FILE,
        work / INFO_FILE,
        nodes=nodes,
        progress=work / EVENTS_FILE,
    )
    logger.info("train: node %d of %d: %s", nodes.rank, nodes.count, " ".join(argv))
    # node 0 relays what global rank 0 (on whichever node) writes; the other nodes report nothing
    with relayed(work / EVENTS_FILE, ctx.progress) if nodes.rank == 0 else contextlib.nullcontext():
        code = subprocess.run(argv, env=worker_env(nproc, on_cpu) | TORCHRUN_ENV, check=False).returncode
    if code != 0:
        raise RuntimeError(
            f"node {nodes.rank}: torchrun exited with code {code} (the workers' errors are above)"
        )


def run_worker(ctx: Context) -> None:
    """Node rank > 0 of a multi-node train stage: join node 0's torchrun, and return when training ends.

    It reads what node 0 prepared on the shared volume (run.yaml in node 0's work directory) and takes no
    lock, makes or moves no directory and writes no result: node 0 owns the output. (Its torchrun worker may
    be global rank 0, which writes the checkpoints and metrics into node 0's work directory.) A node that
    finds the output complete (node 0 had nothing left to train, or finished) has nothing to join.
    """
    nodes = nodes_of(ctx.params.training.nodes, ctx.output.name)
    if nodes is None or nodes.rank == 0:
        raise StageError(f"{ctx.output}: worker mode is for node ranks above 0 of a multi-node train stage")
    if not wait_for_rendezvous(nodes, finished=lambda: is_complete(ctx.output)):
        logger.info("train: node %d: %s is complete; nothing to join", nodes.rank, ctx.output)
        return
    with online_environment(ctx):  # extraction.keep: this node's samples are kept in node 0's work dir too
        run_torchrun(ctx, nodes, not has_accelerator())


def sources(ctx: Context) -> DraftSources:
    """The upstream outputs, checked against each other before anything is trained."""
    vocab, data = ctx.input(Stage.VOCAB), ctx.data_input()
    rows, n_train = dataset_split(data / DATA_DIR)
    v = ctx.params.verifier
    common: dict[str, Any] = {
        "verifier": verifier_at_revision(ctx.local_path(v.model), v.revision),
        "trust_remote_code": v.trust_remote_code,
        "dataset": data / DATA_DIR,
        **vocab_files(ctx, vocab),
        "train_ratio": train_ratio(data, rows, n_train),
    }
    if ctx.params.online is not None:  # the producers compute every sample's hidden states while training
        return DraftSources(**common, **online_inputs(ctx))
    extract = ctx.input(Stage.EXTRACT)
    metadata = read_metadata(extract)
    check_hidden_states(extract, metadata, rows)
    return DraftSources(
        **common,
        hidden_states=extract,
        transfer=str(metadata.get("transfer", "file")),
        aux_layers=[int(i) for i in metadata["auxLayers"]],
        hidden_size=int(metadata["hiddenSize"]),
    )


def train_ratio(data: Path, rows: int, n_train: int) -> float:
    """speculators' train_ratio for a dataset whose first `n_train` of `rows` rows are the training rows.

    The data stage's `trainRatio` must agree with its dataset; the value returned has half a row of margin,
    so that speculators' int(rows * ratio) is exactly n_train despite float rounding.
    """
    ratio = read_result(data).get("trainRatio")
    if not isinstance(ratio, int | float) or abs(ratio * rows - n_train) > 0.5:
        raise StageError(
            f"{data}: result.json's trainRatio {ratio} does not match its dataset ({n_train} of {rows} rows "
            "are training rows); re-run the data stage"
        )
    return (n_train + 0.5) / rows


def read_metadata(extract: Path) -> dict[str, Any]:
    """extract's metadata.json, with the fields training needs."""
    path = extract / METADATA_FILE
    try:
        metadata: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise StageError(f"{path}: cannot read it ({exc}); re-run stage extract") from None
    missing = [k for k in ("auxLayers", "hiddenSize", "samples") if k not in metadata]
    if missing:
        raise StageError(f"{path} lacks {missing}: made by another version of stage extract; re-run it")
    return metadata


def vocab_files(ctx: Context, vocab: Path) -> dict[str, Any]:
    result = read_result(vocab)
    size = ctx.params.draft.vocab_size
    if result.get("draftVocabSize") != size:
        raise StageError(
            f"{vocab} maps a draft vocabulary of {result.get('draftVocabSize')} tokens, the spec asks "
            f"draft.vocabSize {size}: pass the vocab stage's output for this spec"
        )
    files = {"d2t": vocab / str(result.get("d2t")), "t2d": vocab / str(result.get("t2d"))}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise StageError(f"the vocab stage's mapping files are missing: {missing}; re-run stage vocab")
    return {**files, "vocab_size": size}


def dataset_split(path: Path) -> tuple[int, int]:
    """(rows, training rows) of a data stage's dataset, which must hold its training rows first."""
    import datasets

    try:
        splits: list[str] = datasets.load_from_disk(str(path)).with_format(None)["split"]
    except (FileNotFoundError, ValueError, KeyError) as exc:
        raise StageError(f"{path}: not a prepared dataset ({exc}); re-run the data stage") from None
    n_train = sum(1 for s in splits if s == TRAIN)
    if any(s != TRAIN for s in splits[:n_train]):
        raise StageError(f"{path}: the training rows do not come first; re-run the data stage")
    if n_train == 0 or n_train == len(splits):
        raise StageError(
            f"{path}: {n_train} training and {len(splits) - n_train} validation rows: training needs both "
            "(the best checkpoint is chosen by validation loss); set dataset.validationFraction above 0 and "
            "give the dataset at least two rows"
        )
    return len(splits), n_train


def check_hidden_states(extract: Path, metadata: dict[str, Any], rows: int) -> None:
    """Every dataset row has its hidden-states file: speculators must never fetch a missing one elsewhere."""
    if metadata.get("samples") != rows:
        raise StageError(
            f"{extract} holds hidden states of {metadata.get('samples')} samples, the dataset has {rows} "
            "rows: they come from different data; re-run stage extract on this data stage's output"
        )
    missing = [i for i in range(rows) if not (extract / file_name(i)).is_file()]
    if missing:
        raise StageError(
            f"{extract} has no hidden states for {len(missing)} rows (e.g. {file_name(missing[0])}): "
            "re-run stage extract (delete its output directory first)"
        )
