"""The one configuration object, ``tilewright.config``.

Every setting is a typed field with a default and a ``TILEWRIGHT_*`` environment variable that
overrides it when the process starts (or when :meth:`Config.reload_env` is called). Tests and
tools change settings for a scope with :meth:`Config.patch`; nothing else in tilewright reads the
environment for these settings. Choice settings take any case ("OFF" is "off"); a bad value's
error lists the choices; a ``TILEWRIGHT_*`` variable that no setting reads (a misspelling) draws
one warning naming the closest one. ``docs/config.md`` lists the same table for users.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import os
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from tilewright.errors import ConfigError


def forced_languages(value: str) -> tuple[str, ...]:
    """The languages a ``force_backend`` value names ("triton,helion" -> both); () for "auto"."""
    return () if value == "auto" else tuple(v for v in value.split(",") if v)


def force_backends() -> tuple[str, ...]:
    """What ``force_backend`` accepts: "auto" and every registered language (looked up when a
    value is checked, so a language registered from outside the package is accepted too)."""
    from tilewright.runtime.languages import force_choices

    return force_choices()


def cpu_targets() -> tuple[str, ...]:
    """What ``cpu_target`` accepts: every target backend with a target that runs on this host's
    CPU tensors (the target registry's ``host_backends``: "cpu", and "xpu" for SYCL's OpenCL
    CPU device), looked up when a value is checked."""
    from tilewright.runtime.targets import host_backends

    return host_backends()


PDL_MODES = ("off", "on", "auto")
ISOLATE_MODES = ("auto", "on", "off")
GRAPH_RACE_MODES = ("auto", "off")


def _setting(default: Any, env: str, doc: str,
             choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None, several: bool = False) -> Any:
    # several: the value may name several choices, comma-separated
    meta = {"env": env, "doc": doc, "choices": choices, "several": several}
    if callable(default):
        return field(default_factory=default, metadata=meta)
    return field(default=default, metadata=meta)


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tilewright")


def _unknown_setting(name: str, names: Any) -> str:
    """The message for a setting ``name`` that does not exist, naming the closest one."""
    close = difflib.get_close_matches(name, list(names), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown setting {name!r}{hint}; known: {', '.join(sorted(names))}"


@dataclass
class Config:
    """Settings for the backend, the autotuner and the runtime.

    Read a setting as an attribute (``tilewright.config.force_backend``); change one for a block
    with ``with tilewright.config.patch(force_backend="triton"): ...``. A compiled model reads
    the settings when a graph compiles (its first call, a recompile), the ops
    (``tilewright.kernels.gemm``) at every call: docs/config.md, "When settings take effect".
    """

    force_backend: str = _setting(
        "auto", "TILEWRIGHT_FORCE_BACKEND",
        "Restrict candidates to one language: 'auto' (the autotuner picks among all) or a "
        "registered language's name, whose templates alone are candidates (a problem none of "
        "them serves runs on ATen): 'aten' (ATen only; loop kernels as PyTorch operators), "
        "'triton' (generated Triton GEMMs and loop kernels, interpreted on the cpu target), "
        "'sycl' (on the xpu target: see cpu_target), 'cpp' (C++ loop kernels and GEMM epilogues on "
        "the cpu target), 'gluon', 'cutedsl', 'metal', 'flydsl', 'helion', "
        "and any registered from outside the package (`tilewright templates` lists them). "
        "Several, comma-separated ('triton,helion'), make those languages' templates compete.",
        force_backends, several=True)
    cpu_target: str = _setting(
        "cpu", "TILEWRIGHT_CPU_TARGET",
        "The target kernels on CPU tensors are generated for: 'cpu' (ATen, Triton interpreted "
        "when forced) or 'xpu' (the SYCL templates, run on the OpenCL CPU device of the sycl "
        "extra and timed against ATen there; without the SYCL runtime one warning and 'cpu').",
        cpu_targets)
    autotune: bool = _setting(
        True, "TILEWRIGHT_AUTOTUNE",
        "Benchmark candidates. When off, the policy's top-ranked candidate is used untimed and "
        "unrecorded (a generated kernel is still checked once against the reference; ATen "
        "replaces it if it fails).")
    cache_dir: str = _setting(
        _default_cache_dir, "TILEWRIGHT_CACHE_DIR",
        "Folder of the persistent autotune cache and of compiled kernel modules "
        "(default ~/.cache/tilewright).")
    debug_dir: str = _setting(
        "", "TILEWRIGHT_DEBUG_DIR",
        "When set, every compiled graph dumps its FX graph, kernel IR, rendered kernels and "
        "wrapper here, for humans.")
    templates: str = _setting(
        "", "TILEWRIGHT_TEMPLATES",
        "Your own templates for every process: comma-separated modules (mypkg.kernels) or .py "
        "files, imported when the template registry is first used (a module's register() is "
        "called when it has one). A new process (tilewright explain/aot/warm, a tuning worker) "
        "sees templates registered by calls only through this or an entry point.")
    fuse_epilogues: bool = _setting(
        True, "TILEWRIGHT_FUSE_EPILOGUES",
        "Fuse bias/activation/residual/scale/cast epilogues into the GEMM that produces them.")
    loop_kernels: bool = _setting(
        True, "TILEWRIGHT_LOOP_KERNELS",
        "Generate pointwise and reduction kernels (fused by the scheduler) for the ops between "
        "GEMMs; when off, those ops run as ATen calls.")
    fuse_quantisation: bool = _setting(
        True, "TILEWRIGHT_FUSE_QUANTISATION",
        "Let the kernel that produces an activation also write its NVFP4 quantisation (packed "
        "values and block scales; when the layer's activation scale is calibrated) or its MX "
        "quantisation (always); when off, "
        "the quantisation is an ATen call of its own (the same bytes).")
    max_candidates: int = _setting(
        6, "TILEWRIGHT_MAX_CANDIDATES",
        "Most generated-kernel candidates the policy keeps per GEMM problem (ATen comes extra).")
    bench_warmup: int = _setting(2, "TILEWRIGHT_BENCH_WARMUP", "Untimed runs before timing.")
    bench_rep: int = _setting(100, "TILEWRIGHT_BENCH_REP", "Most timed runs per candidate.")
    bench_min_rep: int = _setting(
        5, "TILEWRIGHT_BENCH_MIN_REP",
        "Timed runs before timing may stop because the estimate is stable.")
    bench_stable_pct: float = _setting(
        1.0, "TILEWRIGHT_BENCH_STABLE_PCT",
        "Timing stops once the spread (half the interquartile range) is at most this percentage "
        "of the median (after bench_min_rep runs; 0 disables).")
    bench_input_sets: int = _setting(
        3, "TILEWRIGHT_BENCH_INPUT_SETS",
        "Input sets cycled while timing, so caches do not flatter a kernel (1 when the operands "
        "are larger than twice the target's L2, or under the CPU's interpreter, where rotation "
        "cannot matter).")
    bench_budget_ms: float = _setting(
        200.0, "TILEWRIGHT_BENCH_BUDGET_MS",
        "Time budget per candidate (ms): timing stops after this once 1 run is in.")
    bench_abort_ratio: float = _setting(
        4.0, "TILEWRIGHT_BENCH_ABORT_RATIO",
        "A candidate whose first run is this many times slower than the best median so far is "
        "dropped without more runs: it cannot win.")
    bench_tie_pct: float = _setting(
        2.0, "TILEWRIGHT_BENCH_TIE_PCT",
        "Candidates whose medians differ by less than this percentage of the best (or twice "
        "their spread, if larger) are tied; a tie goes to the policy's lower rank.")
    isolate: str = _setting(
        "auto", "TILEWRIGHT_ISOLATE",
        "Compile and benchmark generated candidates in worker processes, so a crash, hang or "
        "OOM disqualifies only that candidate: 'auto' (workers on GPUs, in-process on the CPU), "
        "'on', 'off'. ATen candidates always run in-process.", ISOLATE_MODES)
    compile_timeout_s: float = _setting(
        60.0, "TILEWRIGHT_COMPILE_TIMEOUT_S",
        "Least time (s) a worker may spend compiling a candidate and running it once before it "
        "is killed and the candidate disqualified.")
    compile_timeout_factor: float = _setting(
        5.0, "TILEWRIGHT_COMPILE_TIMEOUT_FACTOR",
        "The compile timeout adapts: max(compile_timeout_s, this x the median compile time "
        "observed so far).")
    bench_timeout_s: float = _setting(
        120.0, "TILEWRIGHT_BENCH_TIMEOUT_S",
        "Most time (s) a worker may spend checking and timing one compiled candidate.")
    bucket_max: int = _setting(
        65536, "TILEWRIGHT_BUCKET_MAX",
        "Dynamic sizes are tuned per power-of-two bucket; sizes above this share its bucket.")
    pretune_buckets: bool = _setting(
        False, "TILEWRIGHT_PRETUNE_BUCKETS",
        "When compiling a GEMM with a dynamic size, tune every bucket up to the trace-time size "
        "at once instead of each bucket when a size in it is first seen.")
    check_candidates: bool = _setting(
        True, "TILEWRIGHT_CHECK_CANDIDATES",
        "Compare each candidate's output with a float64 reference before its time counts.")
    allow_tf32: bool = _setting(
        False, "TILEWRIGHT_ALLOW_TF32",
        "Let fp32 GEMMs use TF32 tensor cores (faster, ~1e-3 relative error).")
    pdl: str = _setting(
        "auto", "TILEWRIGHT_PDL",
        "Programmatic dependent launch for kernels that support it: 'off', 'on' (always), or "
        "'auto' (both variants are candidates and the autotuner measures which is faster: PDL "
        "can speed isolated decode GEMMs and slow a batch).", PDL_MODES)
    cudagraphs: bool = _setting(
        False, "TILEWRIGHT_CUDAGRAPHS",
        "Run compiled CUDA graphs under PyTorch's CUDA-graph trees (record once, then replay), "
        "as torch.compile's mode='reduce-overhead' does; graphs that cannot be captured (CPU "
        "tensors, input mutation, symbolic sizes with no capture sizes) run uncaptured, with a "
        "warning and the reason in their report (compiler/cudagraphs.py).")
    graph_race: str = _setting(
        "auto", "TILEWRIGHT_GRAPH_RACE",
        "The graph race (compiler/race.py): 'auto' times each compiled CPU graph against ATen "
        "over its first calls (an inference graph against the model's own ops as eager runs "
        "them, a training graph against its graph run op by op) and keeps the faster for good "
        "(what the tuner's per-kernel timing cannot see: the wrapper, caches warmed by "
        "neighbours); 'off' always runs the compiled graph. GPU graphs are not raced.",
        GRAPH_RACE_MODES)
    graph_race_rounds: int = _setting(
        5, "TILEWRIGHT_GRAPH_RACE_ROUNDS",
        "Timed calls of each side of the graph race (after one untimed call of each), up to 3 "
        "times as many in a close race; the compiled graph wins when the median of its calls' "
        "ratios to the ATen calls beside them is below 0.97, else ATen (ties included); 0 runs "
        "no race, as graph_race 'off' does.")
    unroll_reductions: int = _setting(
        8, "TILEWRIGHT_UNROLL_REDUCTIONS",
        "Reductions over at most this many elements (static) are lowered as pointwise "
        "expressions (x[..., 0] + x[..., 1]), which fuse into their consumers where a row op "
        "could not (a MoE router's top-k weights renormalised, a softmax over 8 experts); "
        "Inductor's unroll_reductions_threshold is 8 too. 0 keeps every reduction a row op.")
    index_checks: bool = _setting(
        True, "TILEWRIGHT_INDEX_CHECKS",
        "Bounds-check every gathered or scattered index a generated kernel reads through "
        "(embedding, gather, index_select, x[i], scatter_add, index_put, the one-hot scatter, a "
        "flex score_mod's gather, ...) against the dim the user indexed (a view's, not the "
        "buffer's behind it) unless it is proven in range (an iota, a clamp, a modulo, a mask): "
        "out of range the kernel raises "
        "eager's error on the CPU and stops with a device assert on a GPU. Off: no checks (an index "
        "out of range may read or write outside its buffer); bench/index_checks.py measures "
        "their cost. Integer division by zero is checked on the CPU either way.")
    strict: bool = _setting(
        False, "TILEWRIGHT_STRICT",
        "Raise compiler errors instead of falling back to running the graph in ATen "
        "(for tests and development).")

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._env_error: ConfigError | None = None
        # settings read from the environment whose choices are checked on first use
        self._deferred: dict[str, str] = {}

    def __setattr__(self, name: str, value: Any) -> None:
        """Set a setting (checked against its type and choices).

        Raises:
            AttributeError: ``name`` is no setting (a misspelt name would otherwise be a new
                attribute that nothing reads); the message names the closest setting.
            ConfigError: a value outside the setting's choices.
        """
        f = self.__dataclass_fields__.get(name)  # type: ignore[attr-defined]
        if f is None and not name.startswith("_"):
            raise AttributeError(_unknown_setting(name, self.__dataclass_fields__), name=name,  # type: ignore[attr-defined]
                                 obj=self)
        if f is not None:
            value = _normalise(f, value)
            _check_value(f, value)
        object.__setattr__(self, name, value)

    def raise_env_error(self) -> None:
        """Raise the ConfigError a ``TILEWRIGHT_*`` variable caused at import, if any: a fresh
        one each time, whose traceback starts at the caller (not at the import, and not growing
        with every call that raises it). Choices that come from a registry (``force_backend``:
        the languages) are checked here, on first use, not at import."""
        if self._deferred:  # no lock: this runs inside traced code (torch.compile of an op), and
            # two threads checking the same value at once is harmless
            pending, self._deferred = self._deferred, {}
            for name in pending:
                try:
                    _check_value(self.__dataclass_fields__[name], getattr(self, name))  # type: ignore[attr-defined]
                except ConfigError as e:
                    object.__setattr__(self, name, self.__dataclass_fields__[name].default)  # type: ignore[attr-defined]
                    self._env_error = self._env_error or e
        if self._env_error is not None:
            raise ConfigError(*self._env_error.args) from None

    # -- environment ---------------------------------------------------------------------------
    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "Config":
        """Defaults overridden by ``TILEWRIGHT_*`` variables.

        Raises:
            ConfigError: a variable's value does not parse as its setting's type or choices.
        """
        cfg = cls()
        cfg.reload_env(environ)
        return cfg

    def reload_env(self, environ: dict[str, str] | None = None, *, defer_registry: bool = False) -> None:
        """Re-read every ``TILEWRIGHT_*`` override (defaults for those unset are kept).

        Raises:
            ConfigError: a variable's value does not parse or is out of range.
        """
        environ = os.environ if environ is None else environ
        warn_unknown_env(environ)
        for f in dataclasses.fields(self):
            raw = environ.get(f.metadata["env"])
            if raw is not None:
                value = _normalise(f, _parse(f, raw))
                if defer_registry and callable(f.metadata.get("choices")):
                    # a registry's choices, read while tilewright itself imports: importing the
                    # registry here would be circular, so the value is checked on first use
                    # (raise_env_error)
                    _check_value(f, value, choices=False)
                    object.__setattr__(self, f.name, value)
                    self._deferred[f.name] = raw
                else:
                    setattr(self, f.name, value)
        self._env_error = None

    # -- scoped overrides ----------------------------------------------------------------------
    @contextlib.contextmanager
    def patch(self, **changes: Any) -> Iterator["Config"]:
        """Change settings inside a ``with`` block; the old values come back afterwards.

        Raises:
            ConfigError: an unknown setting name or a value outside its choices.
        """
        names = {f.name: f for f in dataclasses.fields(self)}
        for name, value in changes.items():
            if name not in names:
                raise ConfigError(_unknown_setting(name, names))
            _check_value(names[name], _normalise(names[name], value))
        with self._lock:
            old = {name: getattr(self, name) for name in changes}
            for name, value in changes.items():
                setattr(self, name, value)
        try:
            yield self
        finally:
            with self._lock:
                for name, value in old.items():
                    setattr(self, name, value)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def cache_path(self) -> Path:
        return Path(self.cache_dir).expanduser()

    @staticmethod
    def describe() -> list[tuple[str, str, str, str]]:
        """(setting, env var, default, doc) rows, for ``docs/config.md`` and ``--help``."""
        rows = []
        for f in dataclasses.fields(Config):
            default = "~/.cache/tilewright" if f.name == "cache_dir" else repr(f.default)
            rows.append((f.name, f.metadata["env"], default, f.metadata["doc"]))
        return rows


_TYPES = {"bool": bool, "int": int, "float": (int, float), "str": str}


def _check_value(f: dataclasses.Field, value: Any, choices: bool = True) -> None:
    """Type, choices (unless ``choices`` is False) and range of a setting's value."""
    kind = f.type if isinstance(f.type, str) else f.type.__name__
    expected = _TYPES.get(kind)
    if expected is not None and (not isinstance(value, expected)
                                 or (kind in ("int", "float") and isinstance(value, bool))):
        raise ConfigError(f"config.{f.name} must be a {kind}, got {value!r} ({f.metadata['env']})")
    allowed = f.metadata.get("choices") if choices and value != f.default else None
    if callable(allowed):
        allowed = allowed()
    values = value.split(",") if f.metadata.get("several") and isinstance(value, str) else [value]
    bad = [v for v in values if v not in allowed] if allowed else []
    if bad:
        what = f"{f.name}={value!r}" + (f": {', '.join(map(repr, bad))}" if len(values) > 1 else "")
        several = ", or several comma-separated" if f.metadata.get("several") else ""
        raise ConfigError(
            f"{what} is not one of {', '.join(allowed)} "
            f"(set {f.metadata['env']} or config.{f.name} to one of those{several})")
    if kind == "float" and not math.isfinite(value):  # NaN passes every comparison below
        raise ConfigError(f"{f.name}={value!r} must be a finite number ({f.metadata['env']})")
    low = _MINIMUM.get(f.name)
    if low is not None and value < low:
        raise ConfigError(f"{f.name}={value!r} is below its minimum {low} ({f.metadata['env']})")
    if f.name == "cache_dir" and not str(value).strip():
        raise ConfigError(f"cache_dir is empty, which would put the cache in the current folder; "
                          f"unset {f.metadata['env']} or give it a folder")


# settings with a lower bound (counts of at least one, non-negative times, percentages and
# timeouts; a timeout of 0 would fail every candidate)
_MINIMUM = {"max_candidates": 1, "bench_rep": 1, "bench_min_rep": 1, "bench_warmup": 0,
            "bench_input_sets": 1, "bench_budget_ms": 0.0, "bench_stable_pct": 0.0,
            "bench_abort_ratio": 1.0, "bench_tie_pct": 0.0, "compile_timeout_s": 0.001,
            "compile_timeout_factor": 1.0, "bench_timeout_s": 0.001, "bucket_max": 1,
            "graph_race_rounds": 0, "unroll_reductions": 0}


def _normalise(f: dataclasses.Field, value: Any) -> Any:
    """A choice setting's value in its canonical spelling: choices are lower-case words (language
    names are lower-case identifiers, runtime/languages.py), so "OFF" or " Triton, Helion" mean
    "off" and "triton,helion". Free-form strings (cache_dir, debug_dir: paths, where case
    matters) and other types are returned as they are."""
    if not isinstance(value, str) or not f.metadata.get("choices"):
        return value
    if f.metadata.get("several"):
        return ",".join(v.strip().lower() for v in value.split(",") if v.strip())
    return value.strip().lower()


# TILEWRIGHT_* variables read outside this object (so a set one is not taken for a misspelling),
# with who reads them
OTHER_ENV = {
    "TILEWRIGHT_FLYDSL_ROCM": "templates/flydsl/runtime.py: the ROCm folder FlyDSL's compile-only builds use",
    "TILEWRIGHT_TEST_FRESH_PROCESS": "tests/test_flydsl_launch.py: a test re-run in a fresh process",
}
_warned_env: set[str] = set()
_PREFIX = "TILEWRIGHT_"


def unknown_env(environ: Any) -> list[tuple[str, str | None]]:
    """The ``TILEWRIGHT_*`` names in ``environ`` that no setting (and nothing in
    :data:`OTHER_ENV`) reads, each with the closest known name (``difflib``), or None."""
    known = {f.metadata["env"] for f in dataclasses.fields(Config)} | set(OTHER_ENV)
    # compared without the prefix every name shares (with it, any name is "close" to any other)
    tails = {name[len(_PREFIX):]: name for name in known}
    out = []
    for name in sorted(k for k in environ if k.startswith(_PREFIX) and k not in known):
        close = difflib.get_close_matches(name[len(_PREFIX):].upper(), list(tails), n=1, cutoff=0.6)
        out.append((name, tails[close[0]] if close else None))
    return out


def warn_unknown_env(environ: Any) -> None:
    """One ``UserWarning`` per process for each ``TILEWRIGHT_*`` variable that nothing reads (a
    misspelt setting is otherwise silently ignored), naming the closest setting. Not in processes
    that multiprocessing started (tuning workers, data-loader workers): their parent has said it."""
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        return
    for name, close in unknown_env(environ):
        if name in _warned_env:
            continue
        _warned_env.add(name)
        hint = f"; did you mean {close}?" if close else ""
        warnings.warn(f"{name} is set but is not a tilewright setting, so it is ignored{hint} "
                      f"(`python -m tilewright config` lists the settings)", UserWarning, stacklevel=3)


def _parse(f: dataclasses.Field, raw: str) -> Any:
    kind = f.type if isinstance(f.type, str) else f.type.__name__
    env = f.metadata["env"]
    try:
        if kind == "bool":
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError:
        example = {"bool": "1/0, true/false, yes/no or on/off", "int": "an integer such as 4",
                   "float": "a number such as 2.5"}.get(kind, f"a {kind}")
        raise ConfigError(f"{env}={raw!r} is not a valid {kind}; unset it or set it to {example}") from None
    return raw.strip()


def _from_env_or_defaults() -> Config:
    """The process's config. A bad ``TILEWRIGHT_*`` value must not make ``import tilewright``
    fail with a traceback: the defaults are used and the error is raised, with its message, by
    the first compile, kernel call or command (``Config.raise_env_error``)."""
    cfg = Config()
    try:
        cfg.reload_env(defer_registry=True)
    except ConfigError as e:
        cfg = Config()
        cfg._env_error = e
    return cfg


config = _from_env_or_defaults()
