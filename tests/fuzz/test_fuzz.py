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
import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st

import fuzz_profiles  # noqa: F401  (registers the hypothesis profiles)
from fuzz_oracle import MODES, check, unavailable
from fuzz_ops import FACTORIES, catalogue
from fuzz_program import programs

PROFILE = settings.get_profile(os.environ.get("FUZZ_PROFILE", "fuzz-ci"))  # fuzz_profiles registers them
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


# -- the oracle can fail: each kind of disagreement is caught ------------------------------------
def _judge(out, eager, exact=None, tol=1e-4):
    from fuzz_oracle import compare
    compare([out], [eager], [[exact if exact is not None else eager]], tol, [0.0])


def test_the_oracle_catches_nan_inf_and_signed_zero_differences():
    from fuzz_oracle import SpecialMismatch
    ref = torch.tensor([1.0, float("nan"), float("inf"), -0.0])
    _judge(ref.clone(), ref)
    for k, bad in enumerate([0.0, 2.0, float("-inf"), 0.0]):
        out = ref.clone()
        out[k] = bad
        with pytest.raises(SpecialMismatch):
            _judge(out, ref)


def test_the_oracle_takes_either_zero_only_after_a_max_or_min():
    """IEEE 754 leaves max(+0, -0) unspecified and eager answers either way, so a program with a
    max or min may return either zero; any other program must match eager's sign."""
    from fuzz_oracle import SpecialMismatch, _takes_max_or_min, compare
    from fuzz_program import Program, Step

    ref, out = torch.tensor([1.0, -0.0]), torch.tensor([1.0, 0.0])
    compare([out], [ref], [[ref]], 1e-4, [0.0], zero_sign=False)
    with pytest.raises(SpecialMismatch):
        compare([out], [ref], [[ref]], 1e-4, [0.0])
    with pytest.raises(SpecialMismatch):  # a zero for a nonzero is still wrong
        compare([torch.tensor([0.0, 0.0])], [ref], [[ref]], 1e-4, [0.0], zero_sign=False)
    aten = torch.ops.aten

    def program(*ops):
        return Program(inputs=[], steps=[Step(["v"], op, [], {}) for op in ops], outputs=["v"])
    assert _takes_max_or_min(program(aten.exp.default, aten.maximum.default))
    assert _takes_max_or_min(program(aten.clamp_min_.default))
    assert not _takes_max_or_min(program(aten.exp.default, aten.mul.Tensor))


def test_the_oracle_accepts_either_eager_or_the_exact_value_and_nothing_else():
    from fuzz_oracle import SpecialMismatch, WrongValue
    eager = torch.tensor([float("inf"), 1.0], dtype=torch.float16)  # (x * 2) / 2 overflowed in fp16
    exact = torch.tensor([60000.0, 1.0], dtype=torch.float64)
    _judge(torch.tensor([60000.0, 1.0], dtype=torch.float16), eager, exact, tol=1e-2)
    _judge(eager.clone(), eager, exact, tol=1e-2)
    with pytest.raises(SpecialMismatch):
        _judge(torch.tensor([float("nan"), 1.0], dtype=torch.float16), eager, exact, tol=1e-2)
    with pytest.raises(WrongValue):
        _judge(torch.tensor([50000.0, 1.0], dtype=torch.float16), eager, exact, tol=1e-2)
    with pytest.raises(WrongValue):
        _judge(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 3.01]))
    with pytest.raises(WrongValue):
        _judge(torch.tensor([3, 4]), torch.tensor([3, 5]))


def test_the_oracle_catches_wrong_dtypes_shapes_and_missing_errors():
    from fuzz_oracle import MissingError, WrongMeta, check
    with pytest.raises(WrongMeta):
        _judge(torch.ones(3, dtype=torch.float64), torch.ones(3))
    with pytest.raises(WrongMeta):
        _judge(torch.ones(1, 3), torch.ones(3))

    def raises_in_eager_only(x):
        if torch.compiler.is_compiling():
            return x + 1
        raise IndexError("eager refuses")
    with pytest.raises(MissingError):
        check(raises_in_eager_only, [torch.ones(3)], "auto")
