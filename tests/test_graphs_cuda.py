"""graph=cuda-graph from a user's side on a machine without a GPU: installed, listed, and
declining with one log line while the run goes on eager."""

from __future__ import annotations

import logging

from falconet import Detector
from falconet.plugins import get_plugins


def test_cuda_graph_is_registered_by_its_plugin():
    entry = get_plugins().graph_backends.entry("cuda-graph")
    assert entry.provenance.distribution == "falconet-graphs-cuda"


def test_on_the_cpu_it_declines_once_and_the_run_continues_eager(tiny_run, caplog):
    with caplog.at_level(logging.INFO, "falconet.train"):
        summary = Detector("yolo-n").train(**tiny_run, epochs=1, graph="cuda-graph", val=False)
    assert summary["graph"] == "eager"
    declined = [r.message for r in caplog.records if "declined" in r.message]
    assert declined == [
        "graph=cuda-graph declined: CUDA graphs need a CUDA device, and this run is on cpu; "
        "the run continues with graph=eager"
    ]
