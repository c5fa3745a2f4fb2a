"""``Detector.train`` from Python shows the CLI's progress where the program set up no logging,
and ``verbose=False`` keeps it quiet (falconet.training.console)."""

from __future__ import annotations

import logging

import pytest

from falconet.training.callbacks import ConsoleProgress, CSVLogger
from falconet.training.config import ConfigError
from falconet.training.console import run_output, without_progress

log = logging.getLogger("falconet.train")


def no_logging_set_up(monkeypatch):
    """A program that configured no logging: pytest's capture handlers, which it adds to the
    root logger for the test's call, taken away in the call itself."""
    monkeypatch.setattr(logging.getLogger(), "handlers", [])


def test_a_program_without_logging_sees_the_runs_lines_on_stderr(monkeypatch, capsys):
    no_logging_set_up(monkeypatch)
    with run_output(verbose=True):
        log.info("epoch 1/3  train/box 0.5")
    log.info("after the run: not shown")
    err = capsys.readouterr().err
    assert err == "epoch 1/3  train/box 0.5\n"
    assert not logging.getLogger("falconet").handlers  # nothing left behind


def test_verbose_false_shows_warnings_only(monkeypatch, capsys):
    no_logging_set_up(monkeypatch)
    with run_output(verbose=False):
        log.info("epoch 1/3")
        log.warning("data: 3.jpg could not be read")
    assert "epoch" not in capsys.readouterr().err
    assert logging.getLogger("falconet").level == logging.NOTSET  # restored


def test_a_program_that_set_logging_up_keeps_its_own(caplog):
    with caplog.at_level(logging.INFO), run_output(verbose=True):
        log.info("epoch 1/3")
    assert caplog.messages == ["epoch 1/3"]
    assert not logging.getLogger("falconet").handlers


def test_a_quiet_run_has_no_progress_bar():
    callbacks = [CSVLogger, ConsoleProgress()]
    assert without_progress(callbacks) == [CSVLogger]


def test_verbose_is_a_boolean_of_the_api():
    from falconet.detector import Detector

    with pytest.raises(ConfigError, match="verbose='false'"):
        Detector.train(Detector.__new__(Detector), verbose="false")
