"""What every emitter of the expression IR shares: naming values, scopes and the walk.

An emitter turns a DAG of :class:`~tilewright.ir.expr.Node` into statements of one language
(Triton, SYCL C++, Metal). The walk is the same for all: nodes in topological order, each named
once (a constant is written inline), loads, indices, the GEMM accumulator and reductions coming
from the kernel's hooks. A language supplies how a literal, a conversion, an op and a
declaration are written (:meth:`ExprEmitter.literal`, ``convert``, :meth:`ExprEmitter.op_code`,
:meth:`ExprEmitter.declare`).

Values are named by the node itself, not its ``id()``: holding the node keeps it alive, so a node
freed between two emits cannot hand its id, and with it its name, to a new one.
"""

from __future__ import annotations

from typing import Callable

from tilewright.ir.expr import Node, toposort
from tilewright.ir.ops import OPS


class ExprEmitter:
    """Statements for IR values, shared by the language emitters.

    Args:
        load, index, acc, reduce, scan: hooks returning the code of those nodes; ``load(node)``,
            ``reduce(node, operand_code)`` and ``scan(node, operand_code)`` may emit statements
            through :meth:`line` first.
        check: called as ``check(node)`` once a math op's value is named (in ``names``): the
            statements that check it (an integer division's divisor against 0), or None.
        checked: ``checked(node, value, bound, mask)`` (the code of a ``checked`` node's
            operands, ``mask`` None when it has none): the code of its value after the kernel's
            bounds check, which it may emit through :meth:`line` first
            (:func:`tilewright.ir.bounds.check_needed`). Without it a ``checked`` node is an
            error while ``config.index_checks`` is on (nothing would check it).
        prefix: of the names it makes (``t0``, ``t1``, ...).
        indent: of the first statement.
    """

    def __init__(self, *, load: Callable[[Node], str], index: Callable[[Node], str] | None = None,
                 acc: Callable[[Node], str] | None = None, reduce: Callable[[Node, str], str] | None = None,
                 prefix: str = "t", indent: str = "", scan: Callable[[Node, str], str] | None = None,
                 check: Callable[[Node], None] | None = None,
                 checked: Callable[[Node, str, str, str | None], str] | None = None):
        self.hooks = {"load": load, "index": index, "acc": acc, "reduce": reduce, "scan": scan}
        self.checked = checked
        self.check = check
        self.prefix = prefix
        self.lines: list[str] = []
        self.indent = indent
        self.helpers_used: set[str] = set()
        self.names: dict[Node, str] = {}
        self._count = 0
        self._scopes: list[dict[Node, str]] = []

    # -- scopes (loop bodies see outer values; their own die with them) -------------------------
    def push(self) -> None:
        self._scopes.append(dict(self.names))

    def pop(self) -> None:
        self.names = self._scopes.pop()

    def line(self, text: str) -> None:
        self.lines.append(self.indent + text)

    def fresh(self) -> str:
        name = f"{self.prefix}{self._count}"
        self._count += 1
        return name

    def bind(self, node: Node, code: str) -> str:
        """Record an externally computed value for ``node`` (a reduction computed in a loop)."""
        self.names[node] = code
        return code

    # -- what a language says ----------------------------------------------------------------------
    def literal(self, value: object, dtype: str) -> str:
        raise NotImplementedError

    def convert(self, code: str, src: str, dst: str) -> str:
        raise NotImplementedError

    def op_code(self, n: Node, args: list[str]) -> str:
        """Code of a math op (``n.op`` in the IR's op table) over its operands' code."""
        raise NotImplementedError

    def declare(self, name: str, n: Node, code: str) -> str:
        """The statement naming ``code`` (``n``'s value) ``name``."""
        raise NotImplementedError

    def inline(self, n: Node, code: str) -> bool:
        """Whether ``code`` is used as it is rather than named: constants."""
        return n.op == "const"

    # -- the walk -------------------------------------------------------------------------------------
    def emit(self, root: Node) -> str:
        """The name (or literal) holding ``root``'s value in its compute type, emitting what is
        missing."""
        for n in toposort([root], stop=lambda n: n in self.names):
            if n in self.names:
                continue
            if n.op == "checked":  # the checked value under its operand's name, or the check's
                self.names[n] = self._checked(n)
                continue
            code = self._code(n)
            if self.inline(n, code):
                self.names[n] = code
                continue
            name = self.fresh()
            self.line(self.declare(name, n, code))
            self.names[n] = name
            if self.check is not None and n.op in OPS:
                self.check(n)
        return self.names[root]

    def _checked(self, n: Node) -> str:
        value, bound = self.names[n.src[0]], self.names[n.src[1]]
        mask = self.names[n.src[2]] if len(n.src) > 2 else None
        if self.checked is not None:
            return self.checked(n, value, bound, mask)
        from tilewright.ir.bounds import checks_enabled

        if checks_enabled():
            raise ValueError("a gathered index to check, and this kernel checks none")
        return value

    def _code(self, n: Node) -> str:
        args = [self.names[s] for s in n.src]
        if n.op == "const":
            return self.literal(n.arg, n.dtype)
        if n.op in ("load", "index", "acc"):
            hook = self.hooks[n.op]
            if hook is None:
                raise ValueError(f"this kernel has no {n.op} values")
            return hook(n)
        if n.op == "reduce":
            hook = self.hooks["reduce"]
            if hook is None:
                raise ValueError("reductions need a reduction kernel")
            return hook(n, args[0])
        if n.op == "scan":
            hook = self.hooks["scan"]
            if hook is None:
                raise ValueError("this kernel's language has no scans")
            return hook(n, args[0])
        if n.op == "cast":
            return self.convert(args[0], n.src[0].dtype, n.dtype)
        return self.op_code(n, args)
