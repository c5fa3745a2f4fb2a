"""A training process that ends when the process that started it is killed.

Linux leaves a child running when its parent dies, so two launchers that stay between the
user and the training would leave it training, writing checkpoints behind the next run's
back, when they are killed with SIGKILL (which they cannot forward): torchrun's agent, whose
ranks :func:`falconet.training.distributed.start` ties to it, and ``uv run``, which waits on
the command it starts instead of replacing itself with it (``kill -9`` of ``uv run falconet
train`` left the training and its four workers running). The tie is ``PR_SET_PDEATHSIG``:
the kernel signals this process when its parent thread exits. It is set only under those
launchers: a process started from a shell under ``nohup`` or ``setsid`` is meant to outlive
its shell. The loader's workers need nothing: they end when the training does.
"""

from __future__ import annotations

import os
import signal
import sys

RUNNERS = frozenset({"uv"})
"""Names (``/proc/<pid>/comm``) of the command runners that wait between the user and the
training process: their death ends it (:func:`end_with_runner`)."""

PR_SET_PDEATHSIG = 1
"""``prctl`` option: the signal this process gets when its parent dies (linux/prctl.h)."""


def parent_name(pid: int | None = None) -> str | None:
    """The command name of ``pid``'s parent (default: this process's), ``None`` off Linux or
    where ``/proc`` does not say."""
    try:
        if pid is None:
            ppid = os.getppid()
        else:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{ppid}/comm") as f:
            return f.read().strip()
    except (OSError, ValueError, IndexError):
        return None


def end_with_parent(signum: int) -> None:
    """Have Linux send ``signum`` to this process when its parent dies; exit now if the
    parent died before the request took effect. Elsewhere nothing changes."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum)
    if os.getppid() != parent:  # re-parented (to init or a subreaper): the parent was gone
        os._exit(1)


def end_with_runner() -> None:
    """Tie this process to its parent (SIGTERM at its death) where the parent is one of
    :data:`RUNNERS`; under any other parent nothing changes."""
    if parent_name() in RUNNERS:
        end_with_parent(signal.SIGTERM)
