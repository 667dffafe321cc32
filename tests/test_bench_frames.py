"""perf/frames.py: bench sides compiled from one model get frames of their own, so Dynamo
checks no other side's cache entries on a call (the bench then times what a process with one
compiled model sees)."""

from __future__ import annotations

import copy

import torch

from tilewright.perf.frames import fresh_code, own_frames


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x, scale=2.0, *, shift=1.0):
        return self.lin(x).relu() * scale + shift


def test_a_fresh_code_copy_behaves_alike_with_a_code_object_of_its_own():
    f = _Block.forward
    g = fresh_code(f)
    assert g is not f and g.__code__ is not f.__code__ and g.__code__ == f.__code__.replace()
    assert g.__defaults__ == f.__defaults__ and g.__kwdefaults__ == f.__kwdefaults__
    assert g.__qualname__ == f.__qualname__
    assert fresh_code(len) is len  # not a Python function: itself
    h = own_frames(f)  # a function (the kernel cases compile one): its fresh copy
    assert h.__code__ is not f.__code__ and h.__name__ == f.__name__


def test_own_frames_keeps_the_answer_the_state_and_isinstance_and_shares_no_frame():
    torch.manual_seed(0)
    base = torch.nn.Sequential(_Block(), torch.nn.ReLU(), _Block())
    x = torch.randn(3, 8)
    a, b = own_frames(copy.deepcopy(base)), own_frames(copy.deepcopy(base))
    assert torch.equal(a(x), base(x)) and a.state_dict().keys() == base.state_dict().keys()
    assert isinstance(a, torch.nn.Sequential) and isinstance(a[0], _Block) and type(a).__name__ == "Sequential"
    codes = [type(m).forward.__code__ for m in a.modules()]
    others = {id(type(m).forward.__code__) for m in b.modules()} | {id(_Block.forward.__code__)}
    assert not any(id(c) in others for c in codes)  # each copy's frames are its own
    # and compiled copies give eager's answer
    for backend in ("eager", "aot_eager"):
        torch.testing.assert_close(torch.compile(own_frames(copy.deepcopy(base)), backend=backend)(x), base(x))
