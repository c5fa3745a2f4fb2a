"""Contract suites: subclass one in your own tests and set its class attributes.

    from falconet_testing.contracts import PluginContract

    class TestMyPlugin(PluginContract):
        plugin = "my_package.falconet_plugin"   # the entry point's value
        distribution = "my-package"

Every kind of plugin item has its suite here.
"""

from falconet_testing.contracts.assigner import AssignerContract
from falconet_testing.contracts.eval_backend import EvalBackendContract
from falconet_testing.contracts.family import FamilyContract
from falconet_testing.contracts.graph_backend import GraphBackendContract
from falconet_testing.contracts.lever import LeverContract
from falconet_testing.contracts.plugin import PluginContract
from falconet_testing.contracts.precision import PrecisionBackendContract

__all__ = [
    "AssignerContract",
    "EvalBackendContract",
    "FamilyContract",
    "GraphBackendContract",
    "LeverContract",
    "PluginContract",
    "PrecisionBackendContract",
]
