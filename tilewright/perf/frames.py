"""Compiled copies of one model that do not share Dynamo's frames.

Dynamo keeps what it compiled for a frame on the frame's code object, as a list of cache
entries each with its guards, and on every call checks entries until one's guards pass. A bench
that compiles one model several times in one process (tilewright with the race on and off,
``backend="eager"``, Inductor) puts all those entries on the same code objects (the model
class's ``forward`` and its layers'), so each call of one copy first fails the guards of others:
measured on a 0.1 ms softmax, the default side 4-7% slower than ``backend="eager"`` with three
other compiled copies and 0.99-1.01x with a code object of its own, and the Qwen3-MoE training
step's race-off side over Inductor's 1.16x where each alone measured 1.07-1.10x. A user's
process compiles its model once; :func:`own_frames` gives each bench side that condition.
"""

from __future__ import annotations

import types
from typing import Any, Callable

import torch


def fresh_code(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A copy of the Python function ``fn`` with a code object of its own (same globals,
    defaults, closure, name and attributes): Dynamo caches on code objects, so the copy's
    compiled frames are its own. ``fn`` itself where it is not a plain function."""
    if not isinstance(fn, types.FunctionType):
        return fn
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__,
                              fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__dict__.update(fn.__dict__)  # functools.wraps' __wrapped__, transformers' markers
    copy.__qualname__ = fn.__qualname__
    return copy


def own_frames(model: Any) -> Any:
    """``model`` (a copy of its own: its modules are changed in place) with each module's class
    replaced by a subclass whose ``forward`` is a :func:`fresh_code` copy, so a
    ``torch.compile`` of it shares no frame with another compiled copy of the same model.
    ``isinstance`` checks, names and the state dict are unchanged. Returns ``model``; a plain
    function comes back as its :func:`fresh_code` copy."""
    if not isinstance(model, torch.nn.Module):
        return fresh_code(model)
    made: dict[type, type] = {}
    for module in model.modules():
        cls = type(module)
        if cls not in made:
            made[cls] = type(cls.__name__, (cls,), {"forward": fresh_code(cls.forward),
                                                     "__module__": cls.__module__,
                                                     "__qualname__": cls.__qualname__})
        module.__class__ = made[cls]
    return model


__all__ = ["fresh_code", "own_frames"]
