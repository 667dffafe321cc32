"""The ``tilewright`` command. Each subcommand lives in its own module under ``cli/`` with an
``add_parser(subparsers)`` function; it parses arguments and calls library code."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from tilewright.cli import aot, bench, cache, common, demo, explain, info, warm

# one entry per subcommand module; each registers its parser(s)
COMMANDS = [demo, aot, warm, bench, cache, info, explain]


def _version() -> str:
    """tilewright's version and the torch and Triton it runs with (what a bug report needs)."""
    import importlib.util

    import torch

    from tilewright import __version__

    triton = "not installed"
    if importlib.util.find_spec("triton") is not None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            triton = version("triton")
        except PackageNotFoundError:
            triton = "unknown"
    return f"tilewright {__version__} (torch {torch.__version__}, triton {triton})"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tilewright", description="tilewright: kernel generation for PyTorch")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the tuner decides")
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        module.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    from tilewright import config
    from tilewright.errors import TilewrightError

    try:
        config.raise_env_error()
        return args.fn(args)
    except KeyboardInterrupt:
        common.console.print("interrupted", style="yellow")
        return 130
    except TilewrightError as e:
        common.console.print(f"error: {e}", style="red")
        return 2
    except Exception as e:  # noqa: BLE001 - a command line shows a message, -v the traceback
        if args.verbose:
            raise
        common.console.print(f"error: {type(e).__name__}: {e}  (-v shows the traceback)", style="red")
        return 2


if __name__ == "__main__":
    sys.exit(main())
