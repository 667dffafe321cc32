"""Load rendered kernel source as a Python module (the JIT compile driver for Triton and ATen).

Triton reads a kernel's source through ``inspect``, so every module is written to a file under
``<cache_dir>/kernels/`` (named by the hash of its text) before it is imported. For the ``cpu``
target the module is imported with ``TRITON_INTERPRET=1`` so ``@triton.jit`` builds interpreted
kernels that run on CPU tensors; for GPU targets with it off.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import re
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType
from typing import Iterator

from tilewright._config import config
from tilewright.errors import EnvironmentMismatchError, KernelCompileError

log = logging.getLogger("tilewright.runtime")

_lock = threading.RLock()
_modules: dict[tuple[str, bool], ModuleType] = {}


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:20]


@contextlib.contextmanager
def triton_interpret(enabled: bool) -> Iterator[None]:
    """Set ``TRITON_INTERPRET`` for the block (``@triton.jit`` reads it when it decorates)."""
    with _lock:
        old = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1" if enabled else "0"
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("TRITON_INTERPRET", None)
            else:
                os.environ["TRITON_INTERPRET"] = old


def check_interpreter_environment() -> None:
    """Raise a clear error where the installed triton's interpreter cannot run our kernels.

    Triton 3.6's interpreter converts loop bounds with ``int(array)``, which NumPy 2.4 refuses
    ("only 0-dimensional arrays can be converted"); triton 3.7 and newer are fine.

    Raises:
        EnvironmentMismatchError: triton < 3.7 together with numpy >= 2.4.
    """
    import numpy
    import triton

    tv = tuple(int(x) for x in triton.__version__.split(".")[:2])
    nv = tuple(int(x) for x in numpy.__version__.split(".")[:2])
    if tv < (3, 7) and nv >= (2, 4):
        raise EnvironmentMismatchError(
            f"triton {triton.__version__}'s interpreter does not work with numpy "
            f"{numpy.__version__}: install 'numpy<2.4' or triton>=3.7 to run Triton kernels on CPU")


def load_module(source: str, *, name: str, interpret: bool) -> ModuleType:
    """Import rendered source as a module, once per (source, interpret) per process.

    Args:
        source: Python source text (a rendered template).
        name: a readable prefix for the file and module name ("triton_gemm").
        interpret: import under the Triton interpreter (CPU target).

    Raises:
        KernelCompileError: the source does not import (syntax or Triton decoration error).
        EnvironmentMismatchError: see :func:`check_interpreter_environment`.
    """
    digest = source_hash(source)
    key = (digest, interpret)
    with _lock:
        if key in _modules:
            return _modules[key]
        if interpret:
            check_interpreter_environment()
        path = _write(source, name, digest)
        mod_name = f"tilewright_kernels.{name}_{digest}{'_interp' if interpret else ''}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        try:
            with triton_interpret(interpret):
                spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 - any import failure is a compile failure
            raise KernelCompileError(f"kernel module {path} failed to load: {e!r}") from e
        if interpret:
            _route_launches_through_interpreter_language(module)
        sys.modules[mod_name] = module
        _modules[key] = module
        return module


_swapped: dict[int, object] = {}


@contextlib.contextmanager
def interpreter_language() -> Iterator[None]:
    """Make ``triton.language``'s own ``@triton.jit`` helpers (``tl.zeros``, ``tl.cdiv``,
    ``tl.sigmoid``, ...) callable by interpreted kernels for the block.

    Those helpers are decorated once, when triton is first imported: as compiled functions unless
    ``TRITON_INTERPRET`` was already set then, and an interpreted kernel cannot call a compiled
    one. Rather than forcing one mode on the whole process (which would break GPU kernels in it),
    swap interpreted twins in while an interpreted kernel runs, and put the originals back.
    """
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    with contextlib.suppress(ImportError):
        # imported lazily by the launcher; its import asserts the helpers are compiled ones
        import triton.experimental.gluon  # noqa: F401
    modules = [m for m in (tl, getattr(tl, "standard", None), tl.math, tl.core) if m is not None]
    with _lock:
        restore = []
        for mod in modules:
            for name, obj in list(vars(mod).items()):
                if isinstance(obj, JITFunction):
                    twin = _swapped.get(id(obj))
                    if twin is None:
                        twin = _swapped[id(obj)] = InterpretedFunction(obj.fn)
                    setattr(mod, name, twin)
                    restore.append((mod, name, obj))
        try:
            yield
        finally:
            for mod, name, obj in restore:
                setattr(mod, name, obj)


def _route_launches_through_interpreter_language(module: ModuleType) -> None:
    import numpy
    from triton.runtime.interpreter import InterpretedFunction

    for obj in list(vars(module).values()):
        if isinstance(obj, InterpretedFunction):
            run = obj.run

            def run_interpreted(*args, _run=run, **kwargs):
                # the interpreter computes with NumPy, whose overflow/invalid RuntimeWarnings (an
                # inf - inf, a sum over masked-off lanes) are its internals: a kernel on a GPU, or
                # eager's arithmetic, raises none for the same values
                with interpreter_language(), numpy.errstate(all="ignore"):
                    return _run(*args, **kwargs)

            obj.run = run_interpreted


_fallback_roots: dict[Path, Path] = {}  # an unwritable kernels folder -> this process's private one


def _write(source: str, name: str, digest: str) -> Path:
    """The kernel's module file under ``<cache_dir>/kernels/``; when that cannot be written (a
    read-only or mistyped cache dir) a private temporary folder, after one warning, so an
    unusable cache dir costs the reuse across processes, never the kernel."""
    root = config.cache_path / "kernels"
    if root in _fallback_roots:
        return _write_under(_fallback_roots[root], source, name, digest)
    try:
        return _write_under(root, source, name, digest)
    except OSError as e:
        private = _fallback_roots[root] = Path(tempfile.mkdtemp(prefix="tilewright-kernels-"))
        log.warning("cannot write kernel modules under %s (%s: %s); using %s for this process "
                    "(set TILEWRIGHT_CACHE_DIR to a writable folder)", root, type(e).__name__,
                    e.strerror or e, private)
        return _write_under(private, source, name, digest)


_MODULE_NAME = re.compile(r"^\w+_([0-9a-f]{20})\.py$")


def owned_kernel_modules(root: Path | None = None) -> list[Path]:
    """The kernel module files under ``root`` (default ``<cache_dir>/kernels/``) that this
    loader wrote: ``<hash[:2]>/<name>_<hash>.py`` holding exactly the source ``<hash>`` is the
    hash of. Anything else there (a file edited since, someone else's file) is not listed, so
    whoever deletes what this returns deletes no one's work."""
    root = root if root is not None else config.cache_path / "kernels"
    out = []
    for folder in sorted(p for p in root.glob("*") if p.is_dir() and not p.is_symlink() and len(p.name) == 2):
        for path in sorted(folder.iterdir()):
            m = _MODULE_NAME.match(path.name)
            if not m or m.group(1)[:2] != folder.name or path.is_symlink() or not path.is_file():
                continue
            try:
                if source_hash(path.read_text()) == m.group(1):
                    out.append(path)
            except (OSError, UnicodeDecodeError):
                continue
    return out


def _write_under(root: Path, source: str, name: str, digest: str) -> Path:
    folder = root / digest[:2]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}_{digest}.py"
    # what runs is the source just rendered, never what a file under the cache dir says: a
    # module edited, truncated or left half-written is written again before it is imported
    try:
        current = path.read_text()
    except (FileNotFoundError, UnicodeDecodeError):
        current = None
    if current != source:
        if current is not None:
            log.warning("kernel module %s did not hold the source it is named for; rewriting it", path)
        # write then rename, so a concurrent reader never imports half a file
        tmp = path.with_suffix(f".tmp{os.getpid()}_{threading.get_ident()}")
        tmp.write_text(source)
        os.replace(tmp, path)
    return path
