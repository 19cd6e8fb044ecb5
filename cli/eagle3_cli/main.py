"""`eagle3`: the project's command line. It wires the commands the contract, the operator and the pipeline
register (`crd` and `status` are its own) under one parser whose help shows every default."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from eagle3_cli.status_command import add_command as add_status_command
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


DESCRIPTION = """\
Train and serve EAGLE-3 speculative-decoding drafts. One Eagle3Run manifest takes a verifier LLM and a chat
dataset to a vLLM server that speculates with the trained draft: on this machine, stage by stage (eagle3 run),
or on Kubernetes, where the operator (eagle3 operator) runs each stage as a Job once the run is applied."""
EPILOG = """\
examples:
  eagle3 tiny                                         build the tiny CPU verifier and chat dataset (cached)
  eagle3 run examples/tiny/eagle3run.yaml --dry-run   the stage plan, GPUs and bytes; nothing runs
  eagle3 run examples/tiny/eagle3run.yaml             run it here, resuming what is done
  eagle3 status examples/tiny/eagle3run.yaml          that local run's stages
  eagle3 status RUN -n NAMESPACE --watch              a run's stages in the cluster
  eagle3 plan examples/tiny/eagle3run.yaml            the speedup a draft would give, before training
  eagle3 crd | kubectl apply -f -                     the CRD (the Helm chart installs it too)

`eagle3 COMMAND --help` tells each command's options and their defaults."""


class DefaultsShown(argparse.RawDescriptionHelpFormatter):
    """Each option's help ends with its default, where it has one and the help does not say it already."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        empty = action.default in (None, False, "", [], argparse.SUPPRESS)
        shown = not empty and action.option_strings
        if shown and "default" not in text.lower() and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text


def _show_defaults(command: argparse.ArgumentParser) -> None:
    command.formatter_class = DefaultsShown
    for action in command._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _show_defaults(sub)


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="eagle3", description=DESCRIPTION, epilog=EPILOG)
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
    _show_defaults(root)
    return root


# Off a terminal, progress bars are lines of `\r`-joined updates in a log: tqdm (speculators' training, the
# tiny verifier's pretraining), datasets' "Saving the dataset" and transformers' "Writing model shards" each
# read one of these at import, so they are set before any of them is imported, and the stage processes that
# `eagle3 run` starts inherit them. A variable the user set is left as it is.
QUIET_PROGRESS = {
    "TQDM_DISABLE": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}


def quiet_progress_off_a_terminal() -> None:
    """No progress bars where standard error is not a terminal (CI, `| tee`, a pod's log)."""
    if not sys.stderr.isatty():
        for name, value in QUIET_PROGRESS.items():
            os.environ.setdefault(name, value)


def main(argv: Sequence[str] | None = None) -> int:
    quiet_progress_off_a_terminal()
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
