"""`eagle3`: the command line of the project (the CRD, the operator, promotion through git; the pipeline adds
`run` and `stage`)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


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
        pipeline_image=args.pipeline_image,
    )
    return 0


def _read_run(args: argparse.Namespace) -> dict[str, Any]:
    """The run to promote: from --from-file (`-` is stdin), else from the cluster through k8s.py."""
    import asyncio

    import yaml

    from eagle3_operator.k8s import current_namespace, get_run
    from eagle3_operator.promote import PromotionError, select_run

    if args.from_file:
        where = "stdin" if args.from_file == "-" else args.from_file
        try:
            text = sys.stdin.read() if args.from_file == "-" else Path(args.from_file).read_text()
            documents = list(yaml.safe_load_all(text))
        except OSError as exc:
            raise PromotionError(f"{where}: cannot read it ({exc.strerror})") from None
        except yaml.YAMLError as exc:
            raise PromotionError(f"{where}: not YAML or JSON: {exc}") from None
        return dict(select_run(documents, args.run))
    namespace = args.namespace or current_namespace()
    try:
        return asyncio.run(get_run(namespace, args.run))
    except Exception as exc:  # no kubeconfig, no route, refused: say so, with the offline way out
        raise PromotionError(
            f"cannot read Eagle3Run {namespace}/{args.run} from the cluster ({type(exc).__name__}: {exc}); "
            f"check the context and -n, or pass `kubectl get e3r {args.run} -o yaml` with --from-file"
        ) from None


def _promote(args: argparse.Namespace) -> int:
    from eagle3_operator.promote import (
        PromotionError,
        build_promotion,
        commit_message,
        promotion_candidate,
        render,
    )

    try:
        run = _read_run(args)
        document = build_promotion(run, args.format, args.values_key)
        candidate = promotion_candidate(run)
    except PromotionError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    text = render(document, candidate)
    if args.output:
        Path(args.output).write_text(text)
        sys.stderr.write(f"wrote {args.output}\n")
    else:
        sys.stdout.write(text)
    target = args.output or "<the file you saved it to>"
    sys.stderr.write(
        f"\n# Commit it for review, e.g.:\ngit add {target}\ngit commit -F- <<'EOF'\n"
        f"{commit_message(candidate)}EOF\n"
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
    op.add_argument(
        "--pipeline-image",
        default=os.environ.get("EAGLE3_PIPELINE_IMAGE") or None,
        help="image of the stage Jobs of runs whose spec.images.pipeline is unset (default "
        "$EAGLE3_PIPELINE_IMAGE, else eagle3-operator/pipeline:0.1.0)",
    )
    op.set_defaults(func=_operator)
    _add_promote_command(sub)
    _add_pipeline_commands(sub)
    return root


def _add_promote_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    promote = sub.add_parser(
        "promote",
        help="write the git change that serves a run's evaluated draft (a pinned-draft manifest or values)",
        description="Read an Eagle3Run's status.checkpoint (refused unless its gate passed and it exported "
        "its current spec) and write the run's manifest with spec.serving.pinnedCheckpoint {path, sha256}, "
        "or a values snippet with the pin, for a reviewed commit; a suggested commit message goes to stderr.",
    )
    promote.add_argument("run", help="the Eagle3Run's name")
    promote.add_argument("-n", "--namespace", help="its namespace (default: the kubeconfig context's)")
    promote.add_argument(
        "--from-file",
        metavar="FILE",
        help="read the run from FILE (`kubectl get e3r RUN -o yaml` output; `-` is stdin), not the cluster",
    )
    promote.add_argument(
        "--format",
        choices=["manifest", "values"],
        default="manifest",
        help="manifest: the whole pinned-draft Eagle3Run (default); values: only the pin, for Helm values",
    )
    promote.add_argument(
        "--values-key",
        default="spec",
        metavar="DOTTED.KEY",
        help="where --format values nests the pin (default `spec`: spec.serving.pinnedCheckpoint)",
    )
    promote.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    promote.set_defaults(func=_promote)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
