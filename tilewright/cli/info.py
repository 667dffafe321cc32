"""``tilewright templates`` and ``tilewright config``."""

from __future__ import annotations

import argparse

from rich.table import Table

from tilewright.cli.common import console


def cmd_templates(args: argparse.Namespace) -> int:
    from tilewright.templates import manifests

    table = Table(title="registered templates")
    for col in ("backend", "template", "runs on", "parameters", "source hash"):
        table.add_column(col)
    for m in manifests().values():
        for t in m.templates:
            params = ", ".join(f"{k.name}∈{{{','.join(map(str, k.values))}}}" for k in t.space.knobs)
            table.add_row(m.name, t.id, ",".join(m.target_backends), params or "-", t.source_hash)
    console.print(table)
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from tilewright import config

    table = Table(title="tilewright.config (override with the environment variable)")
    for col in ("setting", "value", "env var", "meaning"):
        table.add_column(col, overflow="fold")
    for name, env, _default, doc in config.describe():
        table.add_row(name, repr(getattr(config, name)), env, doc)
    console.print(table)
    return 0


def add_parser(sub) -> None:
    t = sub.add_parser("templates", help="list kernel templates and their parameters")
    t.set_defaults(fn=cmd_templates)
    c = sub.add_parser("config", help="show settings and their environment variables")
    c.set_defaults(fn=cmd_config)
