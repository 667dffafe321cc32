"""Run a rendered Metal loop kernel on the host, for numerics tests with no Mac.

The shader text is compiled as C++20 with ``runtime/metal_shim.h`` and ``tests/metal_exec.h``
(which define what the shim declares: OS threads per Metal thread, barriers, SIMD-group
exchanges) into a shared library with a small driver; the rendered *launcher* module then runs
unchanged except for its two Metal-only lines: the runtime check and ``torch.mps.compile_shader``
(its ``_library`` is a :class:`HostLibrary`). So the launcher's size array, output allocation
and launch geometry are the ones tested, on CPU tensors.

The one source rewrite: a kernel's ``threadgroup T name[N];`` becomes ``static``, so all the
group's OS threads share it (threadgroups run one at a time).
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import subprocess
import tempfile
import types
from pathlib import Path

import torch

from tilewright.runtime.metal_check import SHIM

EXEC = Path(__file__).with_name("metal_exec.h")
_BUILD = Path(tempfile.gettempdir()) / "tw-metal-host"
_TG_DECL = re.compile(r"^(\s*)threadgroup (\w+ \w+\[\d+\];)", re.M)


# the value each Metal builtin argument takes, from the launch's g (group or grid thread),
# t (thread in the group), tg (threads per group) and grid (threads in the grid)
_BUILTINS = {
    "threadgroup_position_in_grid": "g", "thread_position_in_threadgroup": "t",
    "threads_per_threadgroup": "tg", "thread_index_in_simdgroup": "t % 32",
    "simdgroup_index_in_threadgroup": "t / 32", "simdgroups_per_threadgroup": "tg / 32",
    "thread_position_in_grid": "g", "threads_per_grid": "grid",
}
_BUFFER = re.compile(r"(?:device|constant) (const )?(\w+)\* \w+ \[\[buffer\((\d+)\)\]\]")
_BUILTIN = re.compile(r"uint \w+ \[\[(\w+)\]\]")


def _driver(shader: str, kernel: str, fn: str = "tw_run") -> str:
    """``fn(bufs, groups, threads_per_group, grid_threads)``: every thread of a launch of
    ``kernel``, with the kernel's arguments read off its signature."""
    signature = shader[shader.index(f"kernel void {kernel}("):]
    signature = signature[:signature.index(") {")]
    buffers = [f"({'const ' if const else ''}volatile {t}*)bufs[{i}]" for const, t, i in _BUFFER.findall(signature)]
    builtins = [f"(uint)({_BUILTINS[b]})" for b in _BUILTIN.findall(signature)]
    call = f"{kernel}({', '.join(buffers + builtins)});"
    if "threadgroup_position_in_grid" not in signature:  # no barriers: one OS thread walks them all
        return f"""
extern "C" void {fn}(void** bufs, long groups, long tg, long grid) {{
    for (long g = 0; g < grid; ++g) {call}
}}"""
    return f"""
extern "C" void {fn}(void** bufs, long groups, long tg, long grid) {{
    tw_os_barrier group((long)tg);
    twx::group_barrier = &group;
    tw_os_barrier* simd[32];
    for (long s = 0; s < tg / 32; ++s) simd[s] = twx::simd_barriers[s] = new tw_os_barrier(32);
    for (long g = 0; g < groups; ++g) {{
        tw_os_thread* threads[1024];
        for (long t = 0; t < tg; ++t)
            threads[t] = new tw_os_thread([=] {{
                twx::lane_id = t % 32;
                twx::sg_id = t / 32;
                {call}
            }});
        for (long t = 0; t < tg; ++t) {{ threads[t]->join(); delete threads[t]; }}
    }}
    for (long s = 0; s < tg / 32; ++s) delete simd[s];
}}"""


class HostLibrary:
    """Stands in for ``torch.mps.compile_shader(src)``: ``lib.<kernel>(*tensors, threads=(n,),
    group_size=(g,))`` runs the compiled shader on CPU tensors (every kernel function the
    rendered kernel names: ``meta["kernels"]`` when it launches several)."""

    def __init__(self, rendered):
        shader = _TG_DECL.sub(r"\1static \2", rendered.meta["shader"])
        self.kernel = rendered.meta["kernel"]
        self.kernels = list(rendered.meta.get("kernels", [self.kernel]))
        self.grouped = "threadgroup_position_in_grid" in shader  # one threadgroup per row / tile
        source = shader + "".join(_driver(shader, k, f"tw_run_{k}") for k in self.kernels)
        digest = hashlib.sha256((source + SHIM.read_text() + EXEC.read_text()).encode()).hexdigest()[:16]
        _BUILD.mkdir(exist_ok=True)
        lib = _BUILD / f"{digest}.so"
        if not lib.is_file():
            with tempfile.TemporaryDirectory() as inc:
                (Path(inc) / "metal_stdlib").write_text("")
                cmd = ["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-Wno-attributes",
                       "-DTW_METAL_EXEC", "-I", inc, "-include", str(SHIM), "-include", str(EXEC),
                       "-x", "c++", "-", "-o", str(lib) + ".tmp"]
                proc = subprocess.run(cmd, input=source, capture_output=True, text=True)
                if proc.returncode:
                    raise RuntimeError(f"host build of the shader failed:\n{proc.stderr[-4000:]}")
            Path(str(lib) + ".tmp").rename(lib)
        self.lib = ctypes.CDLL(str(lib))
        self.calls: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        self.launched: list[str] = []  # kernel names, in launch order

    def __getattr__(self, name: str):
        if name not in self.__dict__.get("kernels", ()):
            raise AttributeError(name)

        def run(*tensors: torch.Tensor, threads, group_size):
            assert all(t.device.type == "cpu" for t in tensors)
            (n,), (g,) = threads, group_size
            self.calls.append(((n,), (g,)))
            self.launched.append(name)
            if self.grouped:
                assert n % g == 0 and g % 32 == 0 and g <= 1024
            ptrs = (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])
            getattr(self.lib, f"tw_run_{name}")(ptrs, ctypes.c_long(n // g), ctypes.c_long(g), ctypes.c_long(n))

        return run


def host_launcher(rendered, grid_cap: int | None = None) -> types.ModuleType:
    """The rendered launcher module, running on the host: ``launch(*inputs, *sizes, outs=...)``.
    ``grid_cap`` lowers a pointwise kernel's grid so its grid-stride loop takes several steps."""
    mod = types.ModuleType(rendered.name)
    exec(compile(rendered.source, rendered.name, "exec"), mod.__dict__)
    mod.require_metal_runtime = lambda: None  # the two Metal-only lines of the launcher
    mod._library = HostLibrary(rendered)
    if grid_cap is not None and hasattr(mod, "GRID_CAP"):
        mod.GRID_CAP = grid_cap
    return mod
