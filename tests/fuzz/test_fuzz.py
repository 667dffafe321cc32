"""The differential fuzzer (issue 27): random programs of 1-6 ops from the lowering table,
compiled with ``backend="tilewright"`` under each emitter mode, must behave like eager
(fuzz_oracle.py says how they are judged, fuzz_program.py how they are drawn).

Here it runs bounded (profile ``fuzz-ci``: a few derandomized examples per mode, part of
``make test``); ``make fuzz`` runs it long from a fresh seed (docs/fuzzing.md). A failure prints
the program as a reproducer (hypothesis' note); each find becomes a plain test in
test_fuzz_finds.py.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from fuzz_oracle import MODES, check, unavailable
from fuzz_ops import FACTORIES, catalogue
from fuzz_program import EXCLUSIONS, programs

PROFILE = settings.get_profile(os.environ.get("FUZZ_PROFILE", "fuzz-ci"))  # conftest.py registers them
# sycl builds a kernel in seconds on the OpenCL CPU device: fuzzed by make fuzz only
FUZZ_MODES = os.environ.get("FUZZ_MODES", "triton,cpp,auto").split(",")


@pytest.mark.parametrize("mode", FUZZ_MODES)
@settings(PROFILE)
@given(data=st.data())
def test_compiled_programs_behave_like_eager(mode, data):
    why = unavailable(mode)
    if why:
        pytest.skip(f"{mode}: {why}")
    program = data.draw(programs(mode), label="program")
    note(f"reproducer (paste into tests/fuzz/test_fuzz_finds.py):\n{program.source(mode)}")
    if program.raises:
        note(f"eager raises {program.raises}")
    check(program.function(), program.tensors(), mode, dynamic=program.dynamic, program=program)


def test_every_lowering_rule_is_fuzzed_or_says_why_not():
    fuzzed, skipped = catalogue()
    from tilewright.compiler.loops import RULES
    assert set(RULES) == {op for ops in fuzzed.values() for op in ops} | set(skipped)
    n = sum(len(v) for v in fuzzed.values())
    assert n >= 150, f"only {n} overloads fuzzed"
    assert all(fuzzed.values()), {f: len(v) for f, v in fuzzed.items()}
    # the only reasons an overload is not fuzzed: not callable as a functional step, or named
    assert not [op for op, why in skipped.items() if why.startswith(("argument", "family"))], skipped
    assert FACTORIES <= {op for ops in fuzzed.values() for op in ops}


def test_every_exclusion_names_its_issue_and_owner():
    for e in EXCLUSIONS:
        assert e.issue and e.owner and e.why, e
