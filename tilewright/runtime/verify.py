"""Instruction checks on compiled artifacts: did the kernel use the engines it promised?

A template states, per problem, parameters and target, which instructions its compiled kernel
must contain (``wgmma``, ``tcgen05.mma``, ``cp.async.bulk.tensor``, ``v_mfma``, ``v_wmma``,
``tensor_load_to_lds``) and which it must not. A kernel that silently fell back to scalar loads
or a smaller MMA fails here, by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

@dataclass(frozen=True)
class InstructionCheck:
    """What a compiled artifact must contain (and must not), as regular expressions.

    ``artifact`` is the assembly it applies to: "ptx" (NVIDIA) or "amdgcn" (AMD). ``why`` says
    what the template promised, for the report.
    """

    artifact: str
    require: tuple[str, ...] = ()
    forbid: tuple[str, ...] = ()
    why: str = ""


@dataclass(frozen=True)
class VerifyResult:
    """``failures`` is empty when every check passed; ``counts`` how often each required
    pattern occurs (for the report)."""

    failures: tuple[str, ...]
    counts: Mapping[str, int]

    @property
    def ok(self) -> bool:
        return not self.failures


def verify(artifacts: Mapping[str, Path], checks: Iterable[InstructionCheck]) -> VerifyResult:
    """Apply ``checks`` to the assembly files in ``artifacts`` (stage → path)."""
    failures: list[str] = []
    counts: dict[str, int] = {}
    texts: dict[str, str] = {}
    for check in checks:
        path = artifacts.get(check.artifact)
        if path is None:
            failures.append(f"no {check.artifact} artifact to check ({check.why})")
            continue
        text = texts.setdefault(check.artifact, Path(path).read_text(errors="replace"))
        for pattern in check.require:
            n = len(re.findall(pattern, text))
            counts[pattern] = n
            if n == 0:
                failures.append(f"{check.artifact} lacks {pattern!r}: promised {check.why}")
        for pattern in check.forbid:
            if re.search(pattern, text):
                failures.append(f"{check.artifact} contains {pattern!r}, which {check.why} rules out")
    return VerifyResult(tuple(failures), counts)
