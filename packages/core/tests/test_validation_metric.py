"""``metric=``: the validator's stat that best.pt and early stopping follow."""

from __future__ import annotations

import pytest
import torch

from falconet.evaluation.contract import STAT_KEYS, EvalResult
from falconet.training.config import TrainConfig
from falconet.training.validation import METRIC_STATS, fitness


def result(**stats: float) -> EvalResult:
    values = {key: 0.0 for key in STAT_KEYS} | stats
    return EvalResult(values, {}, {}, "test", "0")


@pytest.mark.parametrize(("metric", "stat"), sorted(METRIC_STATS.items()))
def test_each_metric_follows_its_own_stat(metric, stat):
    assert fitness(result(**{stat: 0.37}), metric) == pytest.approx(0.37)
    others = {key: 0.9 for key in STAT_KEYS if key != stat}
    assert fitness(result(**{stat: 0.2}, **others), metric) == pytest.approx(0.2)


def test_fitness_mixes_map50_and_map_and_an_undefined_stat_counts_as_zero():
    assert fitness(result(AP=0.5, AP50=0.8), "fitness") == pytest.approx(0.53)
    assert fitness(result(ARs=-1.0), "mars") == 0.0  # pycocotools' -1: no small objects


def test_every_metric_the_config_accepts_is_scored():
    accepted = TrainConfig.model_fields["metric"].annotation.__args__
    assert set(accepted) == {*METRIC_STATS, "fitness"}
    with pytest.raises(ValueError, match="metric"):
        TrainConfig(metric="map95")


def test_the_best_validation_survives_a_checkpoint_for_the_resumed_runs_table(tmp_path):
    """last.pt keeps the best validation's numbers as plain values (loadable with
    weights_only=True): a resumed run that never beats them still ends with their table."""
    from falconet.training.checkpoint import FORMAT, load_checkpoint
    from falconet.training.trainer import restored_eval, saved_eval

    best = EvalResult(
        {key: 0.1 * i for i, key in enumerate(STAT_KEYS)},
        {"circle": 0.25},
        {"circle": 0.5},
        "pycocotools",
        "2.0.10",
    )
    metrics = {"best": 0.3, "best_epoch": 2, **saved_eval(best)}
    torch.save({"format": FORMAT, "metrics": metrics}, tmp_path / "last.pt")
    assert restored_eval(load_checkpoint(tmp_path / "last.pt")["metrics"]) == best
    assert saved_eval(None) == {}
    assert restored_eval({"best": 0.3, "best_epoch": 2}) is None  # an older checkpoint
