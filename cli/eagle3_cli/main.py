"""`eagle3`: the project's command line. A thin entry: `crd` prints the contract's CRD, `status` shows a run
(in the cluster or local), and each side registers its own commands (the operator: `operator`, `promote`;
the pipeline: `stage`, `produce`, `run`, `tiny`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from eagle3_cli.status import add_command as add_status_command
from eagle3_contract.log_format import (
    ENV_LOG_FORMAT,
    ENV_VERBOSE,
    FORMATS,
    QUIET_LOGGERS,
    LogFormatError,
    configure_logging,
)
from eagle3_operator import commands as operator_commands
from eagle3_pipeline import commands as pipeline_commands

__all__ = ["QUIET_LOGGERS", "main", "parser"]

INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C
DISTRIBUTION = "eagle3-operator"
# The commands whose process runs speculators, which logs through loguru (routed into the one format).
LOGURU_COMMANDS = ("stage", "produce")


def _crd(args: argparse.Namespace) -> int:
    from eagle3_contract.api.crd import render_crd_yaml

    sys.stdout.write(render_crd_yaml(cel=not args.no_cel))
    return 0


def version() -> str:
    """The installed distribution's version (importlib.metadata)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown (not installed: `pip install -e .` in the repository)"


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="eagle3", description=__doc__)
    root.add_argument(
        "-v", "--verbose", action="store_true", help=f"debug logging (stage subprocesses too: ${ENV_VERBOSE})"
    )
    root.add_argument(
        "--log-format",
        choices=FORMATS,
        type=str.lower,
        help=f"log lines as text (default) or one JSON object per line (default ${ENV_LOG_FORMAT}); the "
        "stage subprocesses inherit it",
    )
    root.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = root.add_subparsers(dest="command", required=True)
    crd = sub.add_parser("crd", help="print the Eagle3Run CustomResourceDefinition (YAML)")
    crd.add_argument(
        "--no-cel", action="store_true", help="omit x-kubernetes-validations (Kubernetes < 1.25 servers)"
    )
    crd.set_defaults(func=_crd)
    operator_commands.add_commands(sub)
    pipeline_commands.add_commands(sub)
    add_status_command(sub)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        configure_logging(
            args.log_format, verbose=True if args.verbose else None, loguru=args.command in LOGURU_COMMANDS
        )
    except LogFormatError as exc:
        sys.stderr.write(f"eagle3: {exc}\n")
        return 2
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback, and the shell's code for SIGINT
        sys.stderr.write(f"eagle3 {args.command}: interrupted\n")
        return INTERRUPTED_EXIT_CODE
    return code


if __name__ == "__main__":
    raise SystemExit(main())
