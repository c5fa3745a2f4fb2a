"""``falconet train --help`` fits the terminal: every key's meaning wrapped under its column."""

from __future__ import annotations

from click.testing import CliRunner

from falconet.cli.train_command import train


def test_train_help_wraps_every_line_to_the_terminal():
    for width in (80, 120):
        text = CliRunner().invoke(train, ["--help"], terminal_width=width).output
        assert "Keys (KEY=VALUE; default, meaning):" in text and "threads" in text
        longest = max(text.splitlines(), key=len)
        assert len(longest) <= width, longest
    # a meaning's continuation lines sit under its column, never under the key's
    lines = CliRunner().invoke(train, ["--help"], terminal_width=80).output.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  batch "))
    assert lines[at + 1].startswith(" " * 36) and lines[at + 1][36] != " "
