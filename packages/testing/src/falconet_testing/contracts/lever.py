"""What every lever (``register_levers``) must do: declare itself, answer every run it is asked
about, and never suggest what the run already has.

Set ``levers`` to the plugin's levers; the suite asks each one about a grid of runs (every
verdict it declares, on the CPU and a GPU, each built-in graph and precision, the caches, a
small and a large batch, with and without the GPU figures) with ``options`` (the run's keys,
plugins' own included). Add runs of your own keys with ``options``.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, ClassVar

from falconet.levers import VERDICTS, Lever, LeverContext, Suggestion

GPU_FIGURES = {
    "step_ms": 50.0,
    "loader_wait_fraction": 0.3,
    "gpu_busy": 0.4,
    "kernels_per_step": 900.0,
    "mean_kernel_us": 12.0,
    "host_syncs_per_step": 1.0,
    "cuda_malloc_per_step": 2.0,
    "alloc_retries": 1,
    "peak_reserved_fraction": 0.3,
    "tensor_core_share": 0.2,
}
CPU_FIGURES = {"step_ms": 80.0, "loader_wait_fraction": 0.3, "gpu_busy": None}

RESOLVED = {
    "graph": "graph",
    "amp_dtype": "precision",
    "batch": "batch",
    "workers": "workers",
    "cache": "cache",
}
"""Keys the context holds resolved (``graph=auto`` as the backend that runs), by field."""


def runs(verdict: str, options: tuple[dict[str, Any], ...] = ({},)) -> list[LeverContext]:
    """The grid of runs a lever is asked about for ``verdict``."""
    grid = itertools.product(
        ("cuda", "cpu"),
        ("eager", "compile", "cuda-graph", "whole-step"),
        ("fp32", "fp16", "bf16"),
        ("none", "ram", "gpu"),
        (1, 16),
        options,
    )
    return [
        LeverContext(
            verdict=verdict,
            evidence=GPU_FIGURES if device == "cuda" else CPU_FIGURES,
            device=device,
            graph=graph,
            precision=precision,
            batch=batch,
            workers=2,
            cache=cache,
            cpu_count=8,
            options={**opts, "graph": graph, "amp_dtype": precision, "batch": batch},
            graph_backends=frozenset({"eager", "compile", "cuda-graph", "whole-step"}),
            precision_backends=frozenset({"fp32", "fp16", "bf16"}),
        )
        for device, graph, precision, cache, batch, opts in grid
    ]


def applied(context: LeverContext, suggestion: Suggestion) -> LeverContext:
    """The run once ``suggestion`` is taken."""
    changes: dict[str, Any] = {"options": {**context.options, suggestion.key: suggestion.value}}
    if suggestion.key in RESOLVED:
        changes[RESOLVED[suggestion.key]] = suggestion.value
    return dataclasses.replace(context, **changes)


class LeverContract:
    """Subclass with ``levers`` (the plugin's levers); ``options`` adds runs of its keys."""

    levers: ClassVar[tuple[Lever, ...]]
    options: ClassVar[tuple[dict[str, Any], ...]] = ({},)

    def test_each_declares_itself(self) -> None:
        assert self.levers, "no levers to check"
        for lever in self.levers:
            assert isinstance(lever, Lever), f"{lever!r} does not satisfy falconet.levers.Lever"
            assert lever.name and lever.summary, f"{lever!r} needs a name and a summary"
            assert lever.verdicts, f"lever {lever.name!r} addresses no verdict"
            unknown = set(lever.verdicts) - set(VERDICTS)
            assert not unknown, f"lever {lever.name!r}: unknown verdicts {unknown}; {VERDICTS}"
            assert isinstance(lever.priority, int), f"lever {lever.name!r}: priority is an int"

    def test_answers_every_run_with_a_suggestion_or_none(self) -> None:
        for lever in self.levers:
            for verdict in lever.verdicts:
                for context in runs(verdict, self.options):
                    suggestion = lever.suggest(context)
                    if suggestion is None:
                        continue
                    assert isinstance(suggestion, Suggestion), (lever.name, suggestion)
                    assert suggestion.key and isinstance(suggestion.why, str) and suggestion.why
                    assert suggestion.value is not None, (lever.name, context)

    def test_never_suggests_what_the_run_has(self) -> None:
        for lever in self.levers:
            for verdict in lever.verdicts:
                for context in runs(verdict, self.options):
                    suggestion = lever.suggest(context)
                    if suggestion is None:
                        continue
                    again = lever.suggest(applied(context, suggestion))
                    assert again is None or (again.key, again.value) != (
                        suggestion.key,
                        suggestion.value,
                    ), f"lever {lever.name!r} suggests {suggestion.key}={suggestion.value} again"
