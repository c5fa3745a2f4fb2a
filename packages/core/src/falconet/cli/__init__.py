"""The ``falconet`` command.

The root group holds no commands of its own: every subcommand, the core's included, comes from
the ``commands`` registry, so plugins add theirs (``register_commands``) exactly as the core does.
"""

from __future__ import annotations

import sys

import click

from falconet import __version__
from falconet.plugins import CORE_DISTRIBUTION, PluginLoadError, Plugins, get_plugins
from falconet.training import collector
from falconet.training.parent_death import end_with_runner


def _print_versions(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``falconet --version``: falconet, then each plugin distribution with a status note."""
    if not value or ctx.resilient_parsing:
        return
    plugins: Plugins = ctx.obj
    click.echo(f"falconet {__version__}")
    by_dist: dict[tuple[str, str], list[str]] = {}
    for record in plugins.records:
        if record.distribution != CORE_DISTRIBUTION:
            by_dist.setdefault((record.distribution, record.version), []).append(record.status)
    for (dist, version), statuses in by_dist.items():
        notes = [f"{statuses.count(s)} {s}" for s in ("broken", "disabled") if s in statuses]
        click.echo(f"{dist} {version}" + (f" ({', '.join(notes)})" if notes else ""))
    ctx.exit()


def build_cli(plugins: Plugins) -> click.Group:
    """The root command with every registered subcommand attached."""

    @click.group(context_settings={"help_option_names": ["-h", "--help"]})
    @click.option(
        "--version",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=_print_versions,
        help="Show falconet's and every plugin's version.",
    )
    def cli() -> None:
        """falconet: a performance-first trainer for object detectors."""

    for entry in plugins.commands.entries():
        cli.add_command(entry.item, entry.name)
    return cli


def load_plugins() -> Plugins:
    """The installed plugins, loaded with Python's cyclic garbage collector paused. Loading
    them imports torch and every plugin's modules: a few hundred thousand objects that live as
    long as the process, which the collector would walk in full collections while they are
    made, holding the interpreter, for nothing (:mod:`falconet.training.collector`; the
    trainer pauses it the same way while it assembles a run)."""
    with collector.paused():
        return get_plugins()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point. Under ``uv run`` the command ends when uv is killed
    (:mod:`falconet.training.parent_death`)."""
    end_with_runner()
    try:
        plugins = load_plugins()
    except PluginLoadError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    build_cli(plugins).main(args=argv, prog_name="falconet", obj=plugins)
