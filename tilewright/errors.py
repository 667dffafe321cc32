"""The catalogue of errors tilewright raises. Each message names the problem and what to do."""

from __future__ import annotations


class TilewrightError(Exception):
    """Base of every tilewright error."""


class ConfigError(TilewrightError, ValueError):
    """A setting or ``TILEWRIGHT_*`` variable has a value tilewright cannot use."""


class InvalidInputError(TilewrightError, ValueError):
    """Tensors handed to a tilewright op do not fit it (device, dtype, shape mismatches)."""


class UnsupportedProblemError(TilewrightError):
    """A template or target cannot run this problem; the message says why."""


class RegistrationError(TilewrightError, ValueError):
    """A language or template handed to the registries is inconsistent (the message names the
    field and what it must be)."""


class UnknownTargetError(TilewrightError, KeyError):
    """A target name that is not in the registry."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class KernelCompileError(TilewrightError):
    """Rendering or compiling a kernel failed."""


class NoValidCandidateError(TilewrightError):
    """Every autotune candidate failed its compile, run or correctness check."""


class EnvironmentMismatchError(TilewrightError):
    """An installed package version cannot do what was asked (the message names the fix)."""


class TuningWorkerError(TilewrightError):
    """Tuning worker processes could not be started (an environment problem, not a candidate's)."""


class CacheFileError(TilewrightError):
    """A file given as the tuning cache is something else (a bundle, a database, another
    format): refused, never overwritten or moved."""


class OutputFileError(TilewrightError):
    """A file tilewright was asked to write (an export, a progress file, a report) exists and is
    something else: refused, never overwritten."""
