"""A command started by ``uv run`` ends when uv is killed with SIGKILL; one started by any
other parent outlives it, as ``nohup`` and ``setsid`` users expect."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from falconet.training.parent_death import parent_name

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG")

CHILD = (
    "import os, time\n"
    "from falconet.training.parent_death import end_with_runner\n"
    "end_with_runner()\n"
    "print(os.getpid(), flush=True)\n"
    "time.sleep(60)\n"
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _kill_parent_then_watch(parent: list[str]) -> tuple[int, bool]:
    """Start ``parent`` (which starts the child), SIGKILL it once the child has tied itself,
    and say whether the child was still alive 5 s later (it is killed after either way)."""
    launcher = subprocess.Popen(parent, stdout=subprocess.PIPE, text=True)
    try:
        child = int(launcher.stdout.readline())
        launcher.kill()
        launcher.wait(10)
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        return child, _alive(child)
    finally:
        launcher.kill()
        if "child" in locals() and _alive(child):
            os.kill(child, signal.SIGKILL)


def test_the_parent_s_name_is_read_from_proc():
    assert parent_name() == parent_name(os.getpid())
    assert parent_name(os.getpid()) is not None


@pytest.mark.skipif(shutil.which("uv") is None, reason="needs uv on the PATH")
def test_killing_uv_run_ends_the_command():
    _, alive = _kill_parent_then_watch(
        ["uv", "run", "--no-sync", "--offline", "python", "-c", CHILD]
    )
    assert not alive


def test_another_parent_s_death_leaves_it_running():
    """A parent that is not a runner (here a Python process in place of a shell)."""
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {CHILD!r}])"
    _, alive = _kill_parent_then_watch([sys.executable, "-c", parent])
    assert alive
