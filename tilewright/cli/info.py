"""``tilewright templates``, ``tilewright targets`` and ``tilewright config``."""

from __future__ import annotations

import argparse

from rich.table import Table

from tilewright.cli.common import console


def cmd_templates(args: argparse.Namespace) -> int:
    from tilewright.runtime.languages import languages
    from tilewright.templates import manifests

    langs = Table(title="registered languages")
    for col in ("language", "runs on", "here", "force_backend=<language>"):
        langs.add_column(col)
    for lang in languages():
        why = lang.check()
        langs.add_row(lang.name, ",".join(lang.target_backends), "usable" if why is None else why, lang.forcing)
    console.print(langs)
    table = Table(title="registered templates")
    for col in ("backend", "template", "runs on", "parameters", "source hash"):
        table.add_column(col)
    for m in manifests().values():
        for t in m.templates:
            params = ", ".join(f"{k.name}∈{{{','.join(map(str, k.values))}}}" for k in t.space.knobs)
            table.add_row(m.name, t.id, ",".join(m.target_backends), params or "-", t.source_hash)
    console.print(table)
    return 0


CONFIG_DOC_HEAD = """# Configuration

All settings live in one object, `tilewright.config`. Each has an environment variable
that overrides its default when the process starts; `tilewright config` prints the current values.
In code, change settings for a block with `tilewright.config.patch(...)`:

```python
import tilewright

with tilewright.config.patch(force_backend="triton", autotune=False):
    compiled = torch.compile(model, backend="tilewright")
    compiled(x)          # the first call compiles: its kernels are chosen under the block's settings
```

## When settings take effect

* **Compiled models apply settings when a graph compiles, not at every call.** A graph compiles
  at the first call of the `torch.compile`d model and again whenever Dynamo recompiles it (a new
  shape, dtype or grad mode, or after `torch._dynamo.reset()`); its kernels are chosen under the
  settings in force then. A training graph's backward, compiled at the first `backward()`, uses
  the settings its forward compiled under. Calling a graph that is already compiled inside a
  later `config.patch(...)` block does not change its kernels, and neither does compiling the
  same model again (Dynamo reuses the graphs it has): call `torch._dynamo.reset()` inside the
  block (it drops every compiled graph of the process) to recompile under the block's settings.
  Read at every call of a compiled graph all the same: `strict` (whether a run-time failure
  raises or falls back to ATen) and `bucket_max` (which bucket a dynamic size runs in); a bucket
  first seen at run time is tuned under the settings of that call.
* **The ops apply settings at every call.** `tilewright.kernels.gemm` (`torch.ops.tilewright.gemm`)
  and `torch.ops.tilewright.nvfp4_mm` run the kernel chosen under the `force_backend`, `autotune`,
  `max_candidates`, `allow_tf32`, `pdl`, `check_candidates` and `cache_dir` in force at the call:
  inside a `config.patch(...)` block, the block's; at the next call after it, the old ones again.
  Each problem is tuned once per process and combination of those (timing under the `bench_*`
  settings of that first call), and a problem already in the tuning cache is not timed again.
* **Environment variables are read once**, when tilewright is imported (or at
  `tilewright.config.reload_env()`). A bad value does not stop the import; the first compile,
  op call or command raises one `ConfigError` line naming the variable and the values it takes
  (`from tilewright import ConfigError` to catch it). Choice values take any case
  (`TILEWRIGHT_GRAPH_RACE=OFF` is `off`; paths keep theirs). A `TILEWRIGHT_*` variable that no
  setting reads, a misspelling such as `TILEWRIGHT_GRAPH_RAC`, is ignored with one warning per
  process naming the closest setting (`TILEWRIGHT_FLYDSL_ROCM` is read by the FlyDSL toolchain,
  docs/flydsl.md). An attribute that is no setting (`tilewright.config.grpah_race = "off"`)
  raises `AttributeError` naming the closest one, as `config.patch(grpah_race=...)` raises
  `ConfigError`.

## Settings

| setting | environment variable | default | meaning |
| --- | --- | --- | --- |
"""
CONFIG_DOC_TAIL = """
Booleans accept `1/0`, `true/false`, `yes/no`, `on/off`. A value that does not parse stops
the program with a `ConfigError` naming the variable (a `torch.compile`d model raises it from
its first call, as itself: one line, not a `BackendCompilerFailed`).

(This page is generated: `tilewright config --markdown > docs/config.md`.)
"""


def cmd_config(args: argparse.Namespace) -> int:
    from tilewright import config

    if args.markdown:
        rows = "".join(f"| `{n}` | `{env}` | `{default}` | {doc} |\n" for n, env, default, doc in config.describe())
        print(CONFIG_DOC_HEAD + rows + CONFIG_DOC_TAIL, end="")
        return 0

    table = Table(title="tilewright.config (override with the environment variable)")
    for col in ("setting", "value", "env var", "meaning"):
        table.add_column(col, overflow="fold")
    for name, env, _default, doc in config.describe():
        table.add_row(name, repr(getattr(config, name)), env, doc)
    console.print(table)
    return 0


def cmd_targets(args: argparse.Namespace) -> int:
    from tilewright.runtime.targets import ALIASES, TARGETS

    table = Table(title="targets (dense peak rates; sources in tilewright/runtime/targets.py)")
    for col in ("target", "aliases", "part", "SMs/CUs", "warp", "smem/LDS KiB", "bf16 TFLOP/s",
                "fp8", "fp4", "HBM GB/s", "features"):
        table.add_column(col, overflow="fold")
    for name, t in TARGETS.items():
        rates = dict(t.peak_tflops)
        aliases = ", ".join(a for a, v in ALIASES.items() if v == name)
        table.add_row(name, aliases, t.device, str(t.num_sms), str(t.warp_size),
                      str(t.smem_per_block // 1024) if t.smem_per_block < 1 << 30 else "-",
                      f"{rates.get('bf16', 0):g}", f"{rates.get('fp8', 0):g}" if "fp8" in rates else "-",
                      f"{rates.get('fp4', 0):g}" if "fp4" in rates else "-", f"{t.hbm_gbps:g}",
                      ", ".join(sorted(t.features)))
    console.print(table)
    return 0


def add_parser(sub) -> None:
    g = sub.add_parser("targets", help="list the chips tilewright generates kernels for")
    g.set_defaults(fn=cmd_targets)
    t = sub.add_parser("templates", help="list kernel templates and their parameters")
    t.set_defaults(fn=cmd_templates)
    c = sub.add_parser("config", help="show settings and their environment variables")
    c.add_argument("--markdown", action="store_true", help="print docs/config.md")
    c.set_defaults(fn=cmd_config)
