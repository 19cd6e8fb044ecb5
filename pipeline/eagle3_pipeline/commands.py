"""The pipeline's commands of `eagle3` (`stage`, `produce`, `run`, `plan`, `tiny`): parsers here, the programs
imported when run (torch is slow to import)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

from eagle3_contract.api.status import Eagle3RunStatus
from eagle3_contract.cli_types import MAX_HIDDEN_SIZE, MAX_LAYERS, bounded_int, positive_int, ratio
from eagle3_contract.generation import DEFAULT_EPOCHS, DEFAULT_ORIGINAL_RATIO
from eagle3_contract.stages import ORDER


def _stage(args: argparse.Namespace) -> int:
    from eagle3_pipeline.stage_main import run_stage

    return run_stage(args.stage, args.spec, args.artifacts, args.output, args.input, args.token_budget)


def _produce(args: argparse.Namespace) -> int:
    from eagle3_pipeline.stages.extract.producer import main as produce_main

    return produce_main(args.spec, args.artifacts, args.port, dry_run=args.print)


def _run(args: argparse.Namespace) -> int:
    if args.dry_run:
        from eagle3_pipeline.local.dry_run import main as dry_run_main

        if args.layers and not args.hidden_size:
            args.parser.error("--layers sizes a --dry-run's verifier together with --hidden-size: give both")
        shape = (args.hidden_size, args.layers) if args.hidden_size else None
        return dry_run_main(args.file, args.artifacts, args.models, shape)
    if args.hidden_size or args.layers:
        args.parser.error(
            "--hidden-size and --layers size a --dry-run; a run reads the verifier's own config"
        )
    from eagle3_pipeline.local.run_main import main as run_main

    retrain = None
    if args.retrain is not None:
        if args.until is not None:
            args.parser.error("--retrain trains after the run's last stage: leave out --until")
        from eagle3_pipeline.local.retrain import Retrain

        ratio_ = DEFAULT_ORIGINAL_RATIO if args.original_ratio is None else args.original_ratio
        retrain = Retrain(Path(args.retrain), ratio_, args.epochs or DEFAULT_EPOCHS)
    elif args.original_ratio is not None or args.epochs is not None:
        args.parser.error("--original-ratio and --epochs shape a --retrain generation: give --retrain too")
    return run_main(args.file, args.artifacts, args.models, args.vllm, args.until, retrain)


def _plan(args: argparse.Namespace) -> int:
    from eagle3_pipeline.local.plan import main as plan_main

    return plan_main(args.file, args.artifacts, args.models, args.vllm, args.acceptance_length)


def acceptance_length(text: str) -> float:
    """`--acceptance-length L`: a finite number of at least 1 (a step that accepts no draft token yields 1);
    its upper bound, k + 1, depends on the manifest and is checked with it (eagle3_pipeline.local.plan)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 1.0:
        raise argparse.ArgumentTypeError(
            f"{text}: an acceptance length is at least 1 (tokens per verifier step, the verifier's own one "
            "included) and at most evaluation.numSpeculativeTokens + 1"
        )
    return value


def local_status_reader(path: str, artifacts: str | None) -> Callable[[], tuple[str, Eagle3RunStatus]]:
    """`eagle3 status FILE`: a function that reads the local run of manifest `path` (its artifacts, and
    what `eagle3 run` recorded there), titled `local run NAME (ARTIFACTS)`; ValueError for a bad manifest."""
    from pathlib import Path

    from eagle3_contract.api.manifest import load_manifest
    from eagle3_pipeline.local.run import default_artifacts
    from eagle3_pipeline.local.status import local_status, record_name

    def read() -> tuple[str, Eagle3RunStatus]:
        manifest = load_manifest(path)  # every time: an edited spec is another plan
        root = Path(artifacts) if artifacts else default_artifacts(manifest)
        return f"local run {record_name(manifest)} ({root})", local_status(manifest, root)

    return read


def _tiny(args: argparse.Namespace) -> int:
    from eagle3_pipeline.tiny.build import main as tiny_main

    return tiny_main(args.models, force=args.force)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `stage`, `produce`, `run`, `plan` and `tiny` on the `eagle3` command line."""
    from eagle3_contract.online import PRODUCER_PORT

    stage = sub.add_parser("stage", help="run one stage program (what a stage Job's container runs)")
    stage.add_argument("stage", choices=[s.value for s in ORDER], help="the stage to run")
    stage.add_argument("--spec", required=True, help="the Eagle3Run document (YAML or JSON)")
    stage.add_argument("--artifacts", required=True, help="root of the artifacts volume")
    stage.add_argument("--output", required=True, help="output directory, relative to --artifacts")
    stage.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="an upstream stage's output (repeatable)",
    )
    stage.add_argument(
        "--token-budget", type=positive_int, default=None, help="tokens per batch (extract, generate)"
    )
    stage.set_defaults(func=_stage)
    produce = sub.add_parser(
        "produce", help="serve hidden states to an online train stage (vLLM; what a producer pod runs)"
    )
    produce.add_argument("--spec", required=True, help="the Eagle3Run document (YAML or JSON)")
    produce.add_argument("--artifacts", required=True, help="root of the artifacts volume")
    produce.add_argument("--port", type=int, default=PRODUCER_PORT, help="the port vLLM listens on")
    produce.add_argument("--print", action="store_true", help="print the vLLM command line, do not run it")
    produce.set_defaults(func=_produce)
    run = sub.add_parser("run", help="run an Eagle3Run manifest locally, stage by stage, with resume")
    run.add_argument("file", help="an Eagle3Run manifest (the document one would kubectl apply)")
    run.add_argument("--artifacts", help="local artifacts directory (default ./eagle3-artifacts/<run name>)")
    run.add_argument(
        "--models",
        help="local directory standing in for /models (default $EAGLE3_MODELS_ROOT or the user cache)",
    )
    run.add_argument("--vllm", help="the `vllm` executable for stages that start a vLLM server")
    run.add_argument("--until", choices=[stage.value for stage in ORDER], help="stop after this stage")
    run.add_argument(
        "--retrain",
        metavar="RECORDS",
        help="then train the draft's next generation on these captured records (serving.capture's files, or "
        "a directory of them), mixed with the run's data, warm-started from its exported draft, and "
        "evaluated beside it",
    )
    run.add_argument(
        "--original-ratio",
        type=ratio,
        default=None,
        help="with --retrain: the run's own conversations per captured one "
        f"(default {DEFAULT_ORIGINAL_RATIO})",
    )
    run.add_argument(
        "--epochs",
        type=positive_int,
        default=None,
        help=f"with --retrain: the generation's training epochs (default {DEFAULT_EPOCHS})",
    )
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="print the stage plan and the estimates (tokens, hidden-state bytes, GPUs); run nothing",
    )
    run.add_argument(
        "--hidden-size",
        type=bounded_int("hidden size", MAX_HIDDEN_SIZE),
        help="with --dry-run: the verifier's hidden size, where neither its config (a local path, the Hub "
        "cache, the Hub) nor the table of known verifiers has it",
    )
    run.add_argument(
        "--layers",
        type=bounded_int("layers", MAX_LAYERS),
        help="with --hidden-size: the verifier's number of layers",
    )
    run.set_defaults(func=_run, parser=run)
    plan = sub.add_parser(
        "plan", help="predict, before training, the speedup a draft would give (runs the predict stage)"
    )
    plan.add_argument("file", help="an Eagle3Run manifest")
    plan.add_argument("--artifacts", help="local artifacts directory (default ./eagle3-artifacts/<run name>)")
    plan.add_argument("--models", help="local directory standing in for /models (as `eagle3 run`)")
    plan.add_argument("--vllm", help="the `vllm` executable (as `eagle3 run --vllm`)")
    plan.add_argument(
        "--acceptance-length",
        type=acceptance_length,
        action="append",
        default=[],
        metavar="L",
        help="also show the prediction at this acceptance length (repeatable)",
    )
    plan.set_defaults(func=_plan)
    tiny = sub.add_parser("tiny", help="build the tiny CPU verifier and example chat dataset (cached)")
    tiny.add_argument("--models", help="where to put them (default the per-user cache); prints the directory")
    tiny.add_argument("--force", action="store_true", help="rebuild even when a complete build is cached")
    tiny.set_defaults(func=_tiny)
