"""Value types of the `eagle3` command line's options, for the parsers of both sides (the operator's and the
pipeline's commands, and the thin entry's own): a value out of range is a usage error, exit code 2 with one
line from argparse, before anything runs."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def positive_seconds(text: str) -> float:
    """A finite number of seconds above 0 (`--interval`, `--resync-seconds`)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def ratio(text: str) -> float:
    """A finite number of at least 0 (`--original-ratio`)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of at least 0")
    return value


def positive_int(text: str) -> int:
    """A whole number above 0 (`--token-budget`)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return value


# The largest a --dry-run's stand-in verifier may be: no released transformer comes near (Kimi-K2.5: hidden
# size 7168, 61 layers), and a typo's extra digits would print estimates in exabytes.
MAX_HIDDEN_SIZE = 131_072
MAX_LAYERS = 1024


def bounded_int(name: str, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from 1 to `high`, the refusal naming `name`."""

    def parse(text: str) -> int:
        value = positive_int(text)
        if value > high:
            raise argparse.ArgumentTypeError(
                f"{text!r}: {name} is at most {high:,} (no transformer is larger; check the digits)"
            )
        return value

    parse.__name__ = name.replace(" ", "_")  # argparse names the type in its message
    return parse


def port(text: str) -> int:
    """A TCP port, 0 to 65535 (`--metrics-port`, `--health-port`; 0 leaves that server off)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0 to 65535; 0 is off)")
    return value


def whole_seconds_or_off(text: str) -> int:
    """Whole seconds, 0 to 3600; 0 turns the bound off (`--watch-seconds`)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r} is not whole seconds from 0 to 3600 (0 is off)")
    return value
