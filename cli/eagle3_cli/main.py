"""`eagle3`: the project's command line. A thin entry: `crd` prints the contract's CRD, and each side
registers its own commands (the operator: `operator`, `promote`; the pipeline: `stage`, `produce`, `run`,
`tiny`)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from eagle3_operator import commands as operator_commands
from eagle3_pipeline import commands as pipeline_commands

INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C


def _crd(args: argparse.Namespace) -> int:
    from eagle3_contract.api.crd import render_crd_yaml

    sys.stdout.write(render_crd_yaml(cel=not args.no_cel))
    return 0


# HTTP clients that log every request at INFO (openai's vendored httpx2 among them): quiet unless --verbose.
QUIET_LOGGERS = ("httpx", "httpx2", "httpcore", "openai")


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="eagle3", description=__doc__)
    root.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = root.add_subparsers(dest="command", required=True)
    crd = sub.add_parser("crd", help="print the Eagle3Run CustomResourceDefinition (YAML)")
    crd.add_argument(
        "--no-cel", action="store_true", help="omit x-kubernetes-validations (Kubernetes < 1.25 servers)"
    )
    crd.set_defaults(func=_crd)
    operator_commands.add_commands(sub)
    pipeline_commands.add_commands(sub)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    if not args.verbose:  # one INFO line per HTTP request drowns a day-long stage's progress lines
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback, and the shell's code for SIGINT
        sys.stderr.write(f"eagle3 {args.command}: interrupted\n")
        return INTERRUPTED_EXIT_CODE
    return code


if __name__ == "__main__":
    raise SystemExit(main())
