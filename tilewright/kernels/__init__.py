"""Public op-level API built on the templates and the autotuner, also as ``torch.library`` ops."""

from tilewright.kernels.gemm import gemm
from tilewright.kernels.grouped import grouped_mm
from tilewright.kernels.rms_norm import rms_norm
from tilewright.kernels.topk import topk


def explain_dispatch(op: str, *args, **kwargs):
    """Which path an eager override call takes and why, without running it: ``op`` is
    "rms_norm" or "topk", the rest that op's arguments. Returns a
    :class:`tilewright.templates.flydsl.gate.Route` (``.path`` "aten", "flydsl" or "gate" when its shape
    class is not measured yet; ``.reason``; ``str()`` says both).

    Raises:
        InvalidInputError: an unknown op, or arguments the op itself would refuse.
    """
    import sys

    from tilewright.errors import InvalidInputError

    # the modules by their full names: the package attributes of those names are the functions
    ops = {name: sys.modules[f"tilewright.kernels.{name}"].explain for name in ("rms_norm", "topk")}
    if op not in ops:
        raise InvalidInputError(f"explain_dispatch: unknown op {op!r}; use one of {', '.join(ops)}")
    return ops[op](*args, **kwargs)


__all__ = ["explain_dispatch", "gemm", "grouped_mm", "rms_norm", "topk"]
