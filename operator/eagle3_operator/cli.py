"""`eagle3`: the command line of the project (the CRD, the operator; the pipeline adds `run` and `stage`)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence


def _crd(args: argparse.Namespace) -> int:
    from eagle3_operator.api.crd import render_crd_yaml

    sys.stdout.write(render_crd_yaml(cel=not args.no_cel))
    return 0


def _operator(args: argparse.Namespace) -> int:
    from eagle3_operator.operator_main import run_operator

    run_operator(
        namespaces=args.namespace,
        liveness=f"http://0.0.0.0:{args.health_port}/healthz",
        metrics_port=args.metrics_port,
    )
    return 0


def _stage(args: argparse.Namespace) -> int:
    from eagle3_pipeline.stage_main import run_stage

    return run_stage(args.stage, args.spec, args.artifacts, args.output, args.input, args.token_budget)


def _run(args: argparse.Namespace) -> int:
    from eagle3_pipeline.local import main as run_main

    return run_main(args.file, args.artifacts, args.models, args.vllm, args.until)


def _tiny(args: argparse.Namespace) -> int:
    from eagle3_pipeline.tiny.build import main as tiny_main

    return tiny_main(args.models, force=args.force)


def _add_pipeline_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from eagle3_operator.stages import ORDER

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
    stage.add_argument("--token-budget", type=int, default=None, help="tokens per batch (extract, generate)")
    stage.set_defaults(func=_stage)
    run = sub.add_parser("run", help="run an Eagle3Run manifest locally, stage by stage, with resume")
    run.add_argument("file", help="an Eagle3Run manifest (the document one would kubectl apply)")
    run.add_argument("--artifacts", help="local artifacts directory (default ./eagle3-artifacts/<run name>)")
    run.add_argument(
        "--models",
        help="local directory standing in for /models (default $EAGLE3_MODELS_ROOT or the user cache)",
    )
    run.add_argument("--vllm", help="the `vllm` executable for stages that start a vLLM server")
    run.add_argument("--until", help="stop after this stage")
    run.set_defaults(func=_run)
    tiny = sub.add_parser("tiny", help="build the tiny CPU verifier and example chat dataset (cached)")
    tiny.add_argument("--models", help="where to put them (default the per-user cache); prints the directory")
    tiny.add_argument("--force", action="store_true", help="rebuild even when a complete build is cached")
    tiny.set_defaults(func=_tiny)


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="eagle3", description=__doc__)
    root.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = root.add_subparsers(dest="command", required=True)
    crd = sub.add_parser("crd", help="print the Eagle3Run CustomResourceDefinition (YAML)")
    crd.add_argument(
        "--no-cel", action="store_true", help="omit x-kubernetes-validations (Kubernetes < 1.25 servers)"
    )
    crd.set_defaults(func=_crd)
    op = sub.add_parser("operator", help="run the operator (kopf) against the current cluster")
    op.add_argument(
        "-n", "--namespace", action="append", default=[], help="watch only this namespace (repeatable)"
    )
    op.add_argument("--health-port", type=int, default=8080, help="liveness endpoint port (/healthz)")
    op.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics port (/metrics)")
    op.set_defaults(func=_operator)
    _add_pipeline_commands(sub)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
