"""The fusion scheduler: which loop nodes share a kernel.

Every loop node starts as a group of its own. Candidate merges are pairs of groups where one
produces what the other reads (vertical: a pointwise chain, a reduction with its producers or
its consumers) or both read the same tensor over the same space (horizontal). Each candidate is
scored by the bytes of memory traffic it saves: a value that no longer leaves the kernel saves
its write and every read; one that still must be stored saves the reads by the merged consumer;
a shared input saves one read. The best-scoring legal merge is made, then the next, until none
is left (Inductor's greedy scheme). A merge is legal when

* it creates no cycle (no path from one group to the other through a third node, checked on a
  networkx graph of groups, GEMMs and ATen calls),
* the result stays within :data:`MAX_MEMBERS` ops and :data:`MAX_BUFFERS` buffers,
* inlining does not multiply the loads: a kernel reading more than :data:`MAX_LOADS` distinct
  elements per program, and more than its members read apart, is refused (short reductions are
  unrolled into pointwise sums, kinds/loop/lower/unroll.py; chained, each inlined into the next,
  ``x.sum(-1).sum(-1).sum(-1)`` over 8s became one expression of 512 loads that took 12 s to
  compile, four of them 4,096 loads and 45 s; a fused MX quantisation's block of 32, which
  recomputes its norm per lane, reads up to ~128), and
* :func:`~tilewright.kinds.loop.fusion.build.build_kernel` can build it (one iteration space, reductions
  read only at their own row).

Then independent groups are launched together (*combo kernels*, Inductor's ``combo_kernels``
idea): two groups with no path between them, in any iteration spaces, become one kernel whose
programs each work on one part (:func:`~tilewright.kinds.loop.fusion.combo.combine`), at most one
reduction and :data:`MAX_COMBO` parts per kernel. It saves launches, not bytes; pairs that read
the same tensors and lie close in the graph go first, and parts further apart than
:data:`COMBO_WINDOW` nodes never combine, so no value has to live much longer.

Afterwards the groups become :class:`~tilewright.compiler.graph.FusedNode`\\ s in a topological
order that keeps the original order where it can.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field

import networkx as nx
import sympy
import torch
import torch.fx as fx

from tilewright._config import config
from tilewright.compiler.fallbacks import LoopBuildFailure, contain
from tilewright.compiler.traffic import is_free
from tilewright.compiler.graph import ExternNode, FusedNode, KernelGraph, LoopNode, Node, TensorMeta, produced, to_sympy
from tilewright.ir import dtypes
from tilewright.ir import expr as E
from tilewright.ir.index import static_or_hint
from tilewright.kinds.loop.fusion.build import BuiltKernel, FusionError, build_kernel
from tilewright.kinds.loop.fusion.combo import combine

log = logging.getLogger("tilewright.compiler")

MAX_MEMBERS = 64
MAX_BUFFERS = 24
MAX_LOADS = 256  # an MX block of 32 recomputes a fused norm's x and weight per lane: 64-128
MAX_COMBO = 4
COMBO_WINDOW = 16


@dataclass
class _Group:
    gid: int
    members: list[LoopNode] = field(default_factory=list)
    parts: int = 1  # sub-kernels of a combo kernel

    @property
    def reductions(self) -> int:
        """1 when the group reduces (a combo holds at most one reduction part)."""
        return int(any(m.is_reduction for m in self.members))

    @property
    def key(self) -> str:
        # "#" never occurs in an FX node name, so a node named "grouped_mm_1" is not a group
        return f"group#{self.gid}"


def dead_code(kg: KernelGraph) -> int:
    """Remove ATen calls and loop nodes whose values nothing uses (views left behind by
    lowering, mostly). Returns how many were removed."""
    outputs = {n.name for n in kg.output.all_input_nodes}
    removed = 0
    while True:
        used: set[str] = set(outputs)
        for n in kg.nodes:
            used.update(n.inputs)
        keep = []
        for n in kg.nodes:
            pure = isinstance(n, LoopNode) or (isinstance(n, ExternNode) and n.fx_node.op == "call_function"
                                               and not n.fx_node.is_impure())
            if pure and not (set(produced(n)) & used):
                removed += 1
                continue
            keep.append(n)
        if len(keep) == len(kg.nodes):
            return removed
        kg.nodes = keep


def _bytes(meta: TensorMeta | None) -> int:
    if meta is None or meta.dtype not in dtypes.NAMES:
        return 0
    n = 1
    for s in meta.hint_shape:
        n *= s
    return n * dtypes.ITEMSIZE[dtypes.name_of(meta.dtype)]


class Scheduler:
    """Groups the loop nodes of one kernel graph (see the module docstring)."""

    def __init__(self, kg: KernelGraph, metas: dict[str, TensorMeta]):
        self.kg = kg
        self.metas = metas
        self.loops = [n for n in kg.nodes if isinstance(n, LoopNode)]
        self.groups: dict[int, _Group] = {i: _Group(i, [n]) for i, n in enumerate(self.loops)}
        self.group_of: dict[str, int] = {n.name: i for i, n in enumerate(self.loops)}
        self.position = {n.name: i for i, n in enumerate(kg.nodes)}
        self.nodes_by_name = {n.name: n for n in kg.nodes}
        self.outputs = {n.name for n in kg.output.all_input_nodes}
        self.producer = kg.producers()
        # pointwise values that read no memory (constants, iotas and what is computed from them)
        # are recomputed by every loop kernel that reads them: no edge, no load
        # (transitively: position ids, an iota plus a constant, read nothing either)
        self.inline: dict[str, LoopNode] = {}
        # a gather's source is read at an index only known at run time: it must be in memory
        # (build.py refuses to recompute it), so it is never inlined, nor what reads it
        gathered = {ld.arg[0] for n in self.loops
                    for ld in E.loads([n.body, *(n.scatter.indirect if n.scatter else ())])
                    if E.load_indirect(ld)}
        for n in self.loops:  # in graph order: what a node reads is decided before it
            if n.name in gathered:
                continue
            if not n.is_reduction and not n.materialize and n.scatter is None and all(
                    x.arg[0] in self.inline for x in E.toposort([n.body]) if x.op == "load"):
                self.inline[n.name] = n
        self.users: dict[str, set[str]] = {}
        self._index_users()
        # an inlined value nobody else needs is not computed on its own
        for name, n in list(self.inline.items()):
            if name not in self.outputs and not self.users.get(name):
                gid = self.group_of.pop(name)
                del self.groups[gid]
                self.loops.remove(n)
        self.failed: set[frozenset[int]] = set()
        self.built: dict[int, BuiltKernel] = {}
        self._next_gid = len(self.loops) + len(self.inline)  # fresh ids for split groups

    def _index_users(self) -> None:
        """``users``: per value, the units (groups, GEMMs, ATen calls) that read it."""
        self.users = {}
        for n in self.kg.nodes:
            for v in n.inputs:
                if isinstance(n, LoopNode) and v in self.inline:
                    continue
                self.users.setdefault(v, set()).add(self.unit(n))

    # -- the graph of units (loop groups, GEMMs, ATen calls) ------------------------------------
    def unit(self, n: Node) -> str:
        gid = self.group_of.get(n.name) if isinstance(n, LoopNode) else None
        return self.groups[gid].key if gid is not None else n.name

    def unit_graph(self) -> nx.DiGraph:
        g = nx.DiGraph()
        for n in self.kg.nodes:
            u = self.unit(n)
            g.add_node(u)
            for v in n.inputs:
                if isinstance(n, LoopNode) and v in self.inline:
                    continue
                p = self.producer.get(v)
                if p is None or (isinstance(p, LoopNode) and p.name not in self.group_of):
                    continue
                if self.unit(p) != u:
                    g.add_edge(self.unit(p), u)
        return g

    # -- scoring --------------------------------------------------------------------------------
    def stored(self, members: list[LoopNode]) -> set[str]:
        names = {m.name for m in members}
        keys = {self.groups[self.group_of[m.name]].key for m in members}
        out = set()
        for m in members:
            if m.name in self.outputs or any(u not in keys for u in self.users.get(m.name, ())):
                out.add(m.name)
        return out & names

    def candidates(self, g: nx.DiGraph) -> list[tuple[int, int, int]]:
        """(bytes saved, group a, group b), best first."""
        out: dict[tuple[int, int], int] = {}
        for a in self.groups.values():
            for m in a.members:
                for user in self.users.get(m.name, ()):
                    if not user.startswith("group#"):
                        continue
                    b = int(user[6:])
                    if b == a.gid:
                        continue
                    consumers = self.users.get(m.name, set())
                    internal = m.name not in self.outputs and consumers <= {a.key, self.groups[b].key}
                    size = _bytes(self.metas.get(m.name))
                    key = (min(a.gid, b), max(a.gid, b))
                    out[key] = out.get(key, 0) + (2 * size if internal else size)
        # horizontal: groups reading the same buffer (the read happens once)
        readers: dict[str, set[int]] = {}
        for grp in self.groups.values():
            for m in grp.members:
                for v in m.inputs:
                    if v not in self.group_of:
                        readers.setdefault(v, set()).add(grp.gid)
        for v, gids in readers.items():
            if len(gids) < 2 or len(gids) > 8:
                continue
            for a, b in itertools.combinations(sorted(gids), 2):
                out[(a, b)] = out.get((a, b), 0) + _bytes(self.metas.get(v))
        ranked = sorted(((s, a, b) for (a, b), s in out.items() if s > 0), key=lambda t: (-t[0], t[1], t[2]))
        return ranked

    def legal(self, g: nx.DiGraph, a: _Group, b: _Group) -> BuiltKernel | None:
        if frozenset((a.gid, b.gid)) in self.failed:
            return None
        members = sorted(a.members + b.members, key=lambda m: self.position[m.name])
        if len(members) > MAX_MEMBERS:
            return None
        # a path a -> x -> b (or back) through another unit would make the merged kernel both
        # feed and wait for x
        for src, dst in ((a.key, b.key), (b.key, a.key)):
            for s in g.successors(src):
                if s != dst and nx.has_path(g, s, dst):
                    self.failed.add(frozenset((a.gid, b.gid)))
                    return None
        try:
            built = build_kernel(members, self._stored_after_merge(a, b, members), self.metas, self.inline)
        except Exception as e:  # noqa: BLE001 - FusionError, or a bug: either costs this merge only
            if config.strict and not isinstance(e, FusionError):
                raise
            log.debug("not fusing %s and %s: %s: %s", a.key, b.key, type(e).__name__, e)
            self.failed.add(frozenset((a.gid, b.gid)))
            return None
        if len(built.args) + len(built.outputs) > MAX_BUFFERS:
            self.failed.add(frozenset((a.gid, b.gid)))
            return None
        loads = _distinct_loads(built)
        if loads > MAX_LOADS and loads > sum(_own_loads(m) for m in members):
            log.debug("not fusing %s and %s: %d loads inlined", a.key, b.key, loads)
            self.failed.add(frozenset((a.gid, b.gid)))
            return None
        return built

    def _stored_after_merge(self, a: _Group, b: _Group, members: list[LoopNode]) -> set[str]:
        keys = {a.key, b.key}
        out = set()
        for m in members:
            if m.name in self.outputs or any(u not in keys for u in self.users.get(m.name, ())):
                out.add(m.name)
        return out

    # -- the loop -------------------------------------------------------------------------------
    def merge(self, a: _Group, b: _Group, built: BuiltKernel) -> None:
        new = _Group(min(a.gid, b.gid), sorted(a.members + b.members, key=lambda m: self.position[m.name]))
        old_keys = {a.key, b.key}
        del self.groups[a.gid], self.groups[b.gid]
        self.groups[new.gid] = new
        for m in new.members:
            self.group_of[m.name] = new.gid
        for v, users in self.users.items():
            if users & old_keys:
                self.users[v] = (users - old_keys) | {new.key}
        self.built[new.gid] = built
        self.failed = {f for f in self.failed if a.gid not in f and b.gid not in f}

    def run(self) -> None:
        while True:
            g = self.unit_graph()
            for _, ga, gb in self.candidates(g):
                a, b = self.groups[ga], self.groups[gb]
                built = self.legal(g, a, b)
                if built is not None:
                    self.merge(a, b, built)
                    break
            else:
                return

    def built_kernel(self, grp: _Group) -> BuiltKernel:
        built = self.built.get(grp.gid)
        if built is None:
            built = self.built[grp.gid] = build_kernel(grp.members, self.stored(grp.members), self.metas,
                                                       self.inline)
        return built

    def combine(self) -> int:
        """Launch independent groups together (see the module docstring); returns the merges."""
        merges = 0
        failed: set[frozenset[int]] = set()  # pairs combine() refused (not the vertical refusals)
        while True:
            g = self.unit_graph()
            # distance counts launches (groups, GEMMs, ATen calls that run work), not views
            order, count = {}, 0
            for u in nx.lexicographical_topological_sort(g, key=lambda u: self._first_position(u)):
                order[u] = count
                count += int(self._launches(u))
            reach = {grp.key: nx.descendants(g, grp.key) for grp in self.groups.values()}
            reads = {grp.gid: {v for m in grp.members for v in m.inputs} for grp in self.groups.values()}
            best = None
            for a, b in itertools.combinations(sorted(self.groups.values(), key=lambda x: order[x.key]), 2):
                dist = abs(order[a.key] - order[b.key])
                if dist > COMBO_WINDOW or a.parts + b.parts > MAX_COMBO:
                    continue
                if len(a.members) + len(b.members) > MAX_MEMBERS:
                    continue
                if frozenset((a.gid, b.gid)) in failed:
                    continue
                if b.key in reach[a.key] or a.key in reach[b.key]:
                    continue  # one needs the other: they cannot run in one launch
                shared = sum(_bytes(self.metas.get(v)) for v in reads[a.gid] & reads[b.gid])
                score = (-shared, dist, a.gid, b.gid)
                if best is None or score < best[0]:
                    best = (score, a, b)
            if best is None:
                return merges
            _, a, b = best
            try:
                built = combine([self.built_kernel(a), self.built_kernel(b)])
            except Exception as e:  # noqa: BLE001 - costs this combination only
                if config.strict and not isinstance(e, FusionError):
                    raise
                log.debug("not combining %s and %s: %s: %s", a.key, b.key, type(e).__name__, e)
                built = None
            if built is None or len(built.args) + len(built.outputs) > MAX_BUFFERS:
                failed.add(frozenset((a.gid, b.gid)))
                continue
            parts = a.parts + b.parts
            self.merge(a, b, built)
            self.groups[min(a.gid, b.gid)].parts = parts
            failed = {f for f in failed if a.gid not in f and b.gid not in f}
            merges += 1

    def _launches(self, unit: str) -> bool:
        if unit.startswith("group#"):
            return True
        node = self.nodes_by_name.get(unit)
        return node is not None and not (isinstance(node, ExternNode) and is_free(node.fx_node))

    def _first_position(self, unit: str) -> int:
        if unit.startswith("group#"):
            return min(self.position[m.name] for m in self.groups[int(unit[6:])].members)
        return self.position.get(unit, 0)

    def kernels(self) -> list[FusedNode]:
        """One :class:`FusedNode` per group. A group whose kernel cannot be built is split into
        its members, each a kernel of its own (the failure costs the fusion, not the graph); a
        single member that cannot be built raises
        :class:`~tilewright.compiler.fallbacks.LoopBuildFailure` (its op then stays ATen's)."""
        out = []
        pending = sorted(self.groups)
        while pending:
            grp = self.groups[pending.pop(0)]
            try:
                out.append(_fused(grp, self.built_kernel(grp), self.metas))
            except Exception as e:  # noqa: BLE001 - contained to this group
                if len(grp.members) == 1:
                    raise LoopBuildFailure({f.name for f in grp.members[0].fx_nodes}, e) from e
                contain(e, grp.key, "fuse", f"building the kernel of {len(grp.members)} fused ops "
                        f"({_describe_ops(grp.members)})", runs="one kernel per op")
                pending = self.split(grp) + pending
        return out

    def split(self, grp: _Group) -> list[int]:
        """Undo ``grp``'s fusion: each member a group of its own. Returns the new group ids."""
        del self.groups[grp.gid]
        self.built.pop(grp.gid, None)
        new = []
        for m in grp.members:
            g = _Group(self._next_gid, [m])
            self._next_gid += 1
            self.groups[g.gid] = g
            self.group_of[m.name] = g.gid
            new.append(g.gid)
        self._index_users()
        return new


def _distinct_loads(built: BuiltKernel) -> int:
    """The distinct loads (element reads: a buffer at an index) of a built kernel's values."""
    stores = built.kernel.stores
    roots = [st.value for st in stores] + [v for st in stores for v in st.indirect]
    return sum(1 for _ in E.loads(roots))


def _own_loads(m: LoopNode) -> int:
    """The distinct loads of one loop node's own body (other members' values read as loads)."""
    return sum(1 for _ in E.loads([m.body]))


def _fused(grp: _Group, built: BuiltKernel, metas: dict[str, TensorMeta]) -> FusedNode:
    from tilewright.problem import LoopProblem

    hints = {}
    for name in built.args + built.outputs:
        meta = metas[name]
        for expr, hint in zip(meta.shape, meta.hint_shape):
            if expr.is_Symbol:
                hints[expr] = hint
    sizes = []
    for k, s in enumerate(built.symbols):
        if s not in hints:
            hints[s] = _hint_of(s, metas)
        sizes.append((f"z{k}", hints[s]))
    dynamic = frozenset(f"z{k}" for k, _ in enumerate(built.symbols))
    first = grp.members[0]
    device = (first.meta.device if first.meta is not None else None)
    ops = _describe_ops(grp.members)
    problem = LoopProblem(built.kernel, tuple(sizes), dynamic, ops)
    return FusedNode(f"kernel_{grp.gid}", [f for m in grp.members for f in m.fx_nodes],
                     kernel=built.kernel, problem=problem, args=built.args, outputs=built.outputs,
                     symbols=built.symbols, members=[m.name for m in grp.members], device=device)


def _hint_of(sym, metas: dict[str, TensorMeta]) -> int:
    """The trace-time value of a size symbol (from any tensor whose dim or stride is exactly
    it, or by solving a dim or stride expression that contains it alone)."""
    def pairs(meta):
        return [*zip(meta.shape, meta.hint_shape), *zip(meta.stride, meta.hint_stride)]

    for meta in metas.values():
        for expr, hint in pairs(meta):
            if expr == sym:
                return hint
    for meta in metas.values():
        for expr, hint in pairs(meta):
            if sym in expr.free_symbols and len(expr.free_symbols) == 1:
                import sympy

                sol = sympy.solve(sympy.Eq(expr, hint), sym)
                if sol:
                    return int(sol[0])
    raise ValueError(f"no trace-time value for size {sym}")


def _describe_ops(members: list[LoopNode]) -> str:
    """A short name for what a kernel computes: its ATen ops, e.g. "pow+mean+add+rsqrt+mul"."""
    names: list[str] = []
    for m in members:
        for f in m.fx_nodes:
            t = str(f.target).split(".")[-2] if isinstance(f.target, object) and "." in str(f.target) else str(f.target)
            if t not in names:
                names.append(t)
    text = "+".join(names)
    return text if len(text) <= 60 else text[:57] + "..."


def schedule(kg: KernelGraph, gm: fx.GraphModule) -> int:
    """Fuse the graph's loop nodes into kernels in place; returns the number of kernels."""
    dead_code(kg)
    metas: dict[str, TensorMeta] = {}
    for node in gm.graph.nodes:
        m = TensorMeta.of(node)
        if m is not None:
            metas[node.name] = m
        elif isinstance(node.meta.get("val"), torch.SymInt) and node.meta["val"].node.hint is not None:
            # a size input a kernel reads as a number (loops.SizeValue): its trace-time value,
            # under a name no value has
            val = node.meta["val"]
            metas[f"__size__{node.name}"] = TensorMeta((to_sympy(val),), (sympy.Integer(1),), (int(val.node.hint),),
                                                       torch.int64, torch.device("cpu"), (1,))
    for n in kg.nodes:
        if isinstance(n, LoopNode) and n.meta is not None:
            metas[n.name] = n.meta
    sched = Scheduler(kg, metas)
    if not sched.loops:
        return 0
    sched.run()
    sched.combine()
    fused = sched.kernels()
    member_of = {m: f for f in fused for m in f.members}
    rest = [n for n in kg.nodes if not isinstance(n, LoopNode)]
    units: dict[str, Node] = {n.name: n for n in rest} | {f.name: f for f in fused}
    first_pos = {n.name: i for i, n in enumerate(kg.nodes)}
    for f in fused:
        first_pos[f.name] = min(first_pos[m] for m in f.members)
    g = nx.DiGraph()
    produced_by: dict[str, str] = {}
    for u in units.values():
        g.add_node(u.name)
        for v in produced(u):
            produced_by[v] = u.name
    for u in units.values():
        for v in u.inputs:
            p = produced_by.get(v) or (member_of[v].name if v in member_of else None)
            if p is not None and p != u.name:
                g.add_edge(p, u.name)
    order = list(nx.lexicographical_topological_sort(g, key=lambda name: first_pos[name]))
    kg.nodes = [units[name] for name in order]
    return len(fused)


__all__ = ["MAX_BUFFERS", "MAX_MEMBERS", "Scheduler", "dead_code", "schedule", "static_or_hint"]
