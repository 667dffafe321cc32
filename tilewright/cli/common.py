"""What the subcommands share: the console and small argument helpers."""

from __future__ import annotations

import sys

from rich.console import Console

# wide enough for tables when output goes to a file or CI log (rich assumes 80 columns)
console = Console(width=None if sys.stdout.isatty() else 160)


def csv(text: str) -> list[str]:
    """Split a comma-separated argument."""
    return [t.strip() for t in text.split(",") if t.strip()]
