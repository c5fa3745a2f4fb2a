"""``falconet plugins list``: what is installed, what each plugin registered, what is broken.

The ``--json`` form is a stable schema (``schema_version`` 1), documented in docs/cli.md.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from falconet import __version__
from falconet.plugins import PluginRecord, Plugins

SCHEMA_VERSION = 1


@click.group()
def plugins() -> None:
    """Inspect installed plugins."""


@plugins.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (schema 1).")
@click.option("--check", is_flag=True, help="Exit with status 1 when any plugin is broken.")
@click.pass_obj
def list_plugins(loaded: Plugins, as_json: bool, check: bool) -> None:
    """List installed plugins: distribution, version, status, hooks and registered names."""
    report = plugins_report(loaded)
    click.echo(json.dumps(report, indent=2) if as_json else format_table(report))
    if check and any(p["status"] == "broken" for p in report["plugins"]):
        sys.exit(1)


def plugins_report(loaded: Plugins) -> dict[str, Any]:
    """The ``plugins list --json`` document."""
    return {
        "schema_version": SCHEMA_VERSION,
        "falconet_version": __version__,
        "plugins": [_record_json(loaded, record) for record in loaded.records],
    }


def _record_json(loaded: Plugins, record: PluginRecord) -> dict[str, Any]:
    registered = (
        {
            kind: [
                {"name": e.name, "aliases": list(e.aliases), "summary": _summary(e.item)}
                for e in entries
            ]
            for kind, entries in loaded.registered_by(record.name).items()
        }
        if record.status == "ok"
        else {}
    )
    failure = record.failure
    return {
        "name": record.name,
        "distribution": record.distribution,
        "version": record.version,
        "entry_point": record.entry_point,
        "status": record.status,
        "hooks": record.hooks,
        "registered": registered,
        "error": None
        if failure is None
        else {
            "stage": failure.stage,
            "type": failure.type,
            "message": failure.message,
            "traceback": failure.traceback,
        },
    }


def _summary(item: Any) -> str:
    if isinstance(item, click.Command):
        return item.get_short_help_str(limit=80)
    return str(getattr(item, "summary", ""))


def format_table(report: dict[str, Any]) -> str:
    """A readable table: one row per hook a plugin implements, broken plugins with their error."""
    rows = [("DISTRIBUTION", "VERSION", "PLUGIN", "STATUS", "HOOK", "REGISTERED")]
    for p in report["plugins"]:
        head = (p["distribution"], p["version"], p["name"], p["status"])
        details = _detail_rows(p)
        for i, (hook, registered) in enumerate(details):
            rows.append((*(head if i == 0 else ("",) * 4), hook, registered))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1]
        for row in rows
    ]
    broken = sum(p["status"] == "broken" for p in report["plugins"])
    lines.append("")
    lines.append(
        f"falconet {report['falconet_version']}: {len(report['plugins'])} plugins, "
        f"{broken} broken" + (" (details: falconet plugins list --json)" if broken else "")
    )
    return "\n".join(line.rstrip() for line in lines)


def _detail_rows(p: dict[str, Any]) -> list[tuple[str, str]]:
    if p["status"] == "disabled":
        return [("-", "disabled by FALCONET_DISABLE_PLUGINS")]
    if p["status"] == "broken":
        err = p["error"]
        return [(f"error at {err['stage']}", f"{err['type']}: {err['message']}".splitlines()[0])]
    rows = []
    for hook in p["hooks"]:
        entries = p["registered"].get(hook.removeprefix("register_"), [])
        names = ", ".join(
            e["name"] + (f" ({', '.join(e['aliases'])})" if e["aliases"] else "") for e in entries
        )
        rows.append((hook, names or "(nothing)"))
    return rows or [("-", "(no hooks)")]
