"""falconet's own plugin passes the contract every third-party plugin is held to."""

from falconet_testing.contracts import PluginContract


class TestBuiltinPlugin(PluginContract):
    plugin = "falconet.builtin"
    distribution = "falconet-core"
