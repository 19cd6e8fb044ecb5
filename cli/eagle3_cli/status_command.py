"""`eagle3 status TARGET`: a run's stages as a table, or its status as JSON or YAML for scripts, once or
watched until the run is finished. eagle3_cli.status_targets finds what TARGET names (a local run or an
Eagle3Run in the cluster); eagle3_cli.status draws it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from typing import Any

from eagle3_cli.status import OUTPUTS, Observed, Reader, finished, plain_table, rich_table
from eagle3_contract.cli_types import positive_seconds


def document_text(observed: Observed, output: str, one_line: bool = False) -> str:
    """`observed` as `-o json` or `-o yaml` prints it: one JSON document per line (`one_line`, --watch) or
    indented, or a YAML document (starting `---` with --watch)."""
    document = observed.document()
    if output == "json":
        return (
            json.dumps(document, separators=(",", ":") if one_line else None, indent=None if one_line else 2)
            + "\n"
        )
    import yaml

    text = yaml.safe_dump(document, sort_keys=False, allow_unicode=True)
    return f"---\n{text}" if one_line else text


def _show_documents(read: Reader, watch: bool, interval: float, output: str) -> int:
    """Print the run's document once, or with `watch` each time it changes until the run is finished."""
    last = None
    try:
        while True:
            observed = read()
            text = document_text(observed, output, one_line=watch)
            if text != last:
                sys.stdout.write(text)
                sys.stdout.flush()
                last = text
            if not watch or finished(observed.status):
                return 0
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0


def _drawn(observed: Observed) -> Any:
    return rich_table(observed.title, observed.status, note=observed.note)


def show(read: Reader, watch: bool, interval: float, output: str = "table") -> int:
    """Print the table once, or re-draw it every `interval` seconds until the run is finished or Ctrl-C
    (in place on a terminal; one table after another elsewhere); `output` json or yaml: the documents."""
    if output != "table":
        return _show_documents(read, watch, interval, output)
    try:
        from rich.console import Console
    except ImportError:  # the operator's image: aligned text
        return _show_one_by_one(read, watch, interval, None)
    console = Console()
    if not (watch and console.is_terminal):
        return _show_one_by_one(read, watch, interval, console)
    from rich.live import Live

    observed = read()
    try:
        with Live(_drawn(observed), console=console, auto_refresh=False) as live:
            while not finished(observed.status):
                time.sleep(interval)
                observed = read()
                live.update(_drawn(observed), refresh=True)
    except KeyboardInterrupt:
        pass
    return 0


def _show_one_by_one(read: Reader, watch: bool, interval: float, console: Any) -> int:
    try:
        while True:
            observed = read()
            if console is not None:
                console.print(_drawn(observed))
            else:
                width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
                sys.stdout.write(
                    plain_table(observed.title, observed.status, note=observed.note, width=width)
                )
                sys.stdout.flush()
            if not watch or finished(observed.status):
                return 0
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0


def _status(args: argparse.Namespace) -> int:
    from eagle3_cli.status_targets import cluster_reader, is_path, local_reader

    cluster = bool(args.namespace or args.kubeconfig)
    if cluster and (args.artifacts or is_path(args.target)):
        args.parser.error(
            "-n and --kubeconfig name a run in the cluster by its name; a local run (a manifest or an "
            "artifacts directory) takes --artifacts instead"
        )
    try:
        if not cluster and is_path(args.target):
            reader = local_reader(args.target, args.artifacts)
        else:
            reader = cluster_reader(args.target, args.namespace, args.kubeconfig, note=args.output == "table")
        return show(reader, args.watch, args.interval, args.output)
    except (ValueError, OSError, RuntimeError) as exc:  # what the readers raise, with their message
        sys.stderr.write(f"error: {exc}\n")
        return 1


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `status` on the `eagle3` command line."""
    status = sub.add_parser(
        "status",
        help="show a run's stages: phase, progress, rate, ETA, attempts, duration and key results",
        description="TARGET, a path: a local run, given by its manifest file (what `eagle3 run FILE` ran), "
        "its artifacts directory (what `eagle3 run` wrote), or a directory holding its manifest. TARGET, a "
        "name: an Eagle3Run in the cluster (the kubeconfig's context, -n), and so is TARGET with -n or "
        "--kubeconfig; a run no operator has begun says whether one is running.",
    )
    status.add_argument(
        "target", metavar="TARGET", help="a run's manifest or artifacts directory, or an Eagle3Run's name"
    )
    status.add_argument("-n", "--namespace", help="the run's namespace (default: the kubeconfig context's)")
    status.add_argument(
        "--kubeconfig", metavar="FILE", help="the cluster's kubeconfig (default $KUBECONFIG, ~/.kube/config)"
    )
    status.add_argument(
        "--artifacts", help="a manifest's artifacts directory (default ./eagle3-artifacts/<run name>)"
    )
    status.add_argument(
        "-o",
        "--output",
        choices=OUTPUTS,
        default="table",
        help="json or yaml: the run's name (and namespace or artifacts) and its status as the API shows it, "
        "for scripts; with --watch, a document each time it changes (JSON: one per line)",
    )
    status.add_argument(
        "-w", "--watch", action="store_true", help="re-draw until the run is finished or Ctrl-C"
    )
    status.add_argument(
        "--interval",
        type=positive_seconds,
        default=3.0,
        metavar="S",
        help="seconds between re-draws (default 3)",
    )
    status.set_defaults(func=_status, parser=status)
