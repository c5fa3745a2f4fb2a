"""Fixtures and contract suites for falconet plugin authors.

Installing this package registers a pytest plugin (entry point ``pytest11``) that provides the
fixtures in :mod:`falconet_testing.pytest_plugin`; the suites in
:mod:`falconet_testing.contracts` are test classes to subclass, one per kind of plugin item.
"""

from falconet_testing.fixtures import fresh_plugins

__all__ = ["fresh_plugins"]
