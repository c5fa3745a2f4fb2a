"""falconet's own plugin: registered through the same manager as every external plugin.

It provides the precision backends, the ``eager`` and ``compile`` graph backends (and
``compile``'s key), the reference ``pycocotools`` eval backend, the loggers, the core's CLI
commands and the levers of the core's keys, so the core has no private path around the
registries.
"""

from __future__ import annotations

from falconet.registry import Register


def register_precision_backends(register: Register) -> None:
    from falconet.precision import BF16, FP16, FP32

    for backend in (FP32, FP16, BF16):
        register(backend)


def register_graph_backends(register: Register) -> None:
    from falconet.graph_backends.compile import CompileBackend
    from falconet.graph_backends.eager import EagerBackend

    register(EagerBackend())
    register(CompileBackend())


def register_train_keys(register: Register) -> None:
    from falconet.graph_backends.compile import COMPILE_KEYS
    from falconet.grad_checkpoint import GRAD_CHECKPOINT_KEYS

    register(COMPILE_KEYS)
    register(GRAD_CHECKPOINT_KEYS)


def register_callbacks(register: Register) -> None:
    from falconet.training.callbacks import LOGGERS

    for logger in LOGGERS:
        register(logger)


def register_levers(register: Register) -> None:
    from falconet.builtin_levers import LEVERS

    for lever in LEVERS:
        register(lever)


def register_eval_backends(register: Register) -> None:
    from falconet.evaluation.pycocotools_backend import PycocotoolsBackend

    register(PycocotoolsBackend())


def register_commands(register: Register) -> None:
    from falconet.cli.data_command import data
    from falconet.cli.eval_command import eval_command
    from falconet.cli.export_command import export
    from falconet.cli.plugins_command import plugins
    from falconet.cli.train_command import predict, train, val

    register(plugins)
    register(eval_command)
    register(data)
    register(train)
    register(val)
    register(predict)
    register(export)
