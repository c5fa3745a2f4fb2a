"""falconet-profiler is a well-behaved plugin (falconet-testing's contract)."""

from __future__ import annotations

from falconet_testing.contracts import PluginContract


class TestProfilerPlugin(PluginContract):
    plugin = "falconet_profiler"
    distribution = "falconet-profiler"
