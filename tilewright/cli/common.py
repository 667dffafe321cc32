"""What the subcommands share: the console and small argument helpers."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

# Wide enough for tables when output goes to a file or CI log (rich assumes 80 columns).
# Markup is off: paths, error text, regexes and extras like 'tilewright[plot]' are data, and
# rich would eat their brackets (or raise on a stray "[/"). Colour goes through style= or Text.
console = Console(width=None if sys.stdout.isatty() else 160, markup=False)


def csv(text: str) -> list[str]:
    """Split a comma-separated argument."""
    return [t.strip() for t in text.split(",") if t.strip()]


def positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def positive_float(text: str) -> float:
    """argparse type: a float > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number")
    return value


def target_name(text: str) -> str:
    """argparse type: a registered target name or alias (normalised)."""
    from tilewright.errors import UnknownTargetError
    from tilewright.runtime.targets import get_target

    try:
        return get_target(text).name
    except UnknownTargetError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def target_list(text: str) -> list[str]:
    """argparse type: comma-separated target names, at least one."""
    names = [target_name(t) for t in csv(text)]
    if not names:
        raise argparse.ArgumentTypeError("no target given; e.g. --target sm_90a,gfx950")
    return names
