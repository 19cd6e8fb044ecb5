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
