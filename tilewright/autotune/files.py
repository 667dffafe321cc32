"""The one rule for files tilewright writes where a user pointed it: replace only what is ours.

An export, a warm progress file or a report may land on a path that already holds something.
It is replaced only when it is a regular file of the kind about to be written (or empty); a
README, another tool's database, a tuning cache where a bundle was asked for, a folder, a device
node or a FIFO is refused with :class:`~tilewright.errors.OutputFileError` and left alone.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any, Callable

from tilewright.errors import OutputFileError


def special_file_reason(path: Path) -> str | None:
    """Why ``path`` (following symlinks) is not a regular file tilewright may read or replace:
    a folder, a device node, a FIFO or a socket; None for a regular or missing file."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISREG(mode):
        return None
    kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a device node" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket")
    return f"{path} is {kind}, not a regular file"


def json_object(raw: bytes) -> dict[str, Any] | None:
    """The JSON object ``raw`` holds, or None."""
    try:
        data = json.loads(raw.decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def check_replaceable(path: Path | str, ours: Callable[[bytes], bool], what: str) -> None:
    """Refuse to write ``what`` over ``path`` unless it is missing, empty, or ``ours(contents)``.

    Raises:
        OutputFileError: ``path`` is not a regular file, or holds something else.
    """
    path = Path(path)
    why = special_file_reason(path)
    if why:
        raise OutputFileError(f"{why}; not writing {what} there: give a file path")
    if not path.exists():
        return
    raw = path.read_bytes()
    if raw.strip() and not ours(raw):
        raise OutputFileError(f"{path} exists and is not {what}; not overwriting it: write to a new "
                              f"path, or delete it first")
