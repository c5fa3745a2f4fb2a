"""The levers of the core's own keys meet falconet-testing's lever contract."""

from __future__ import annotations

from falconet.builtin_levers import LEVERS
from falconet_testing.contracts import LeverContract


class TestCoreLevers(LeverContract):
    levers = LEVERS
