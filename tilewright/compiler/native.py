"""Remembering the native op behind each decomposed composite (softmax, layer norm, ...).

With loop kernels on, the decomposition table opens composite ops (``_softmax``,
``native_layer_norm``, their backward formulas, ...) into pointwise ops and reductions, so the
scheduler can fuse their parts with their neighbours. When the scheduler ends up with a kernel
that is *exactly* one such op, the best a CPU can do with it is the op's own ATen kernel: one
dispatch instead of the decomposition's five to fifteen. To know that, each decomposition is
wrapped (:func:`tagged`): after it ran, the FX nodes of its outputs get a :class:`NativeCall` in
``node.meta[META_KEY]``, naming the op, its arguments (tensors by the FX node that holds them)
and which output each node is. :mod:`tilewright.compiler.programs` later matches a fused kernel
against it.

The proxies are found through ``torch.fx.experimental.proxy_tensor`` (``get_proxy_mode``,
``get_proxy_slot``), private helpers of make_fx: when they are missing or anything about the
call is unexpected, nothing is tagged and the kernel simply has no native candidate.
"""

from __future__ import annotations

import functools
import itertools
import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch

log = logging.getLogger("tilewright.compiler")

META_KEY = "tilewright_native"
_ids = itertools.count()
# ops that hand their input on unchanged (an argument's value may reach the graph through them)
_SAME_VALUE = ("detach", "alias", "lift_fresh")


@dataclass(frozen=True)
class NativeCall:
    """One call of a decomposed op, as the graph saw it.

    Attributes:
        op: the OpOverload's qualified name ("aten._softmax.default").
        args, kwargs: the call's arguments; a tensor is ``("tensor", names)``, the FX node names
            that hold its value (the node itself, then what it detaches or aliases), any other
            value is kept as it is (ints, floats, bools, lists of them, dtypes).
        outputs: per output of the op (flattened), the FX node name holding it (None for a
            non-tensor output).
        call_id: distinguishes calls of the same op.
    """

    op: str
    args: tuple
    kwargs: tuple
    outputs: tuple
    call_id: int


def _value_names(node: Any) -> tuple[str, ...]:
    names = [node.name]
    while (getattr(node, "op", None) == "call_function" and node.args
           and getattr(node.target, "__name__", "").split(".")[0] in _SAME_VALUE):
        node = node.args[0]
        if not hasattr(node, "name"):
            break
        names.append(node.name)
    return tuple(names)


def _plain(x: Any) -> bool:
    if isinstance(x, (list, tuple)):
        return all(_plain(v) for v in x)
    return x is None or isinstance(x, (bool, int, float, str, torch.dtype, torch.device,
                                       torch.layout, torch.memory_format))


def _encode(x: Any, node_of: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(x, torch.Tensor):
        return ("tensor", _value_names(node_of(x)))
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise TypeError("symbolic scalar argument")
    if isinstance(x, (list, tuple)) and not _plain(x):
        raise TypeError("a list holding tensors or symbols")
    return x


def _tag(op: Any, args: tuple, kwargs: dict, out: Any) -> None:
    from torch.fx.experimental import proxy_tensor

    mode = proxy_tensor.get_proxy_mode()
    if mode is None:
        return
    tracer = mode.tracer

    def node_of(t: torch.Tensor) -> Any:
        return proxy_tensor.get_proxy_slot(t, tracer).proxy.node

    enc_args = tuple(_encode(a, node_of) for a in args)
    enc_kwargs = tuple(sorted((k, _encode(v, node_of)) for k, v in kwargs.items()))
    flat = out if isinstance(out, (tuple, list)) else (out,)
    nodes = [node_of(t) if isinstance(t, torch.Tensor) else None for t in flat]
    inputs = {n for a in (*enc_args, *(v for _, v in enc_kwargs))
              if isinstance(a, tuple) and a[:1] == ("tensor",) for n in a[1]}
    if any(n is not None and n.name in inputs for n in nodes):
        return  # an output that is an input: the decomposition computed nothing to match
    call = NativeCall(str(op), enc_args, enc_kwargs,
                      tuple(n.name if n is not None else None for n in nodes), next(_ids))
    for n in nodes:
        if n is not None:
            n.meta[META_KEY] = call  # an enclosing call, tagging after this one, wins


def tagged(op: Any, decompose: Callable) -> Callable:
    """``decompose`` that also tags its outputs' FX nodes with the call (see the module
    docstring). Never changes what it returns; a call it cannot describe goes untagged."""

    @functools.wraps(decompose)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out = decompose(*args, **kwargs)
        try:
            _tag(op, args, kwargs, out)
        except Exception as e:  # noqa: BLE001 - a missing tag only costs a candidate
            log.debug("no native tag for %s: %s", op, e)
        return out

    return wrapper


def native_of(node: Any) -> NativeCall | None:
    """The call an FX node is an output of, if its decomposition was tagged."""
    return node.meta.get(META_KEY) if hasattr(node, "meta") else None
