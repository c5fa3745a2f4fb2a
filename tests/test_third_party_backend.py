"""A third party's plugin, installed beside falconet's own, adds a training key and a graph
backend of higher priority: ``falconet train --help`` lists the key under its distribution,
``graph=auto`` picks the backend, the run reads the key and saves it in args.yaml, and no
line of falconet-core changes for it (tests/fixtures/priority-plugin)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml


def _falconet(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    return subprocess.run(
        [sys.executable, "-m", "falconet", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_help_lists_the_plugins_key_under_its_distribution(priority_plugin_site):
    done = _falconet(priority_plugin_site, "train", "--help")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "Keys of falconet-priority-plugin:" in text
    section = " ".join(text.split("Keys of falconet-priority-plugin:")[1].split())  # unwrapped
    assert "priority_note" in section and "a note the priority-eager backend logs" in section


def test_graph_auto_picks_the_higher_priority_backend_and_the_key_reaches_it(
    priority_plugin_site, tiny_run
):
    keys = {**tiny_run, "epochs": "1", "val": "false", "priority_note": "from-the-cli"}
    done = _falconet(priority_plugin_site, "train", *(f"{k}={v}" for k, v in keys.items()))
    assert done.returncode == 0, done.stderr[-3000:]
    log = done.stderr
    assert "graph=auto: priority-eager" in log
    assert "priority-eager: priority_note=from-the-cli" in log
    (args,) = Path(tiny_run["project"]).glob("*/args.yaml")
    saved = yaml.safe_load(args.read_text())
    assert saved["graph"] == "auto" and saved["priority_note"] == "from-the-cli"


def test_without_the_plugin_its_key_is_unknown(tiny_run, tmp_path):
    """The same key, with the plugin not installed, is refused before anything runs."""
    done = _falconet(
        tmp_path, "train", *(f"{k}={v}" for k, v in tiny_run.items()), "priority_note=x"
    )
    assert done.returncode == 2
    assert "unknown key 'priority_note'" in done.stderr
