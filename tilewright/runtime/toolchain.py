"""Toolchain probes the language folders share: the version of an installed distribution (a
DSL's wheel), and the host C++ compiler the C++ and SYCL folders build with. Cheap checks that
import nothing they probe; language-neutral (each folder words its own reasons with them)."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import shutil

# the end of a reason "... found none ($CXX, g++, c++): install g++ ..." naming the fix
NO_HOST_CXX = "found none ($CXX, g++, c++): install g++ (Debian: apt-get install g++)"


@functools.cache
def dist_version(dist: str) -> str | None:
    """The installed version of distribution ``dist`` ("flydsl", "nvidia-cutlass-dsl"), or None
    when it is not installed (read from its metadata once per process; nothing is imported)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def host_cxx() -> str | None:
    """The host C++ compiler's path: ``$CXX``, else ``g++``, else ``c++``; None when none is on
    ``PATH``."""
    for cand in (os.environ.get("CXX"), "g++", "c++"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None
