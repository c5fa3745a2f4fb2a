"""Where each thread of a process spent its samples, from ``py-spy record --threads -f raw``.

    python tools/pyspy_threads.py docs/bench-results/2026-12-07-pyspy-b64-20k-idle.txt.gz \\
        --process "--worker falconet" --rate 200 --top 25 --thread falconet-decode

py-spy's raw output is one line per distinct stack (``process;thread;frame;...;frame count``).
Per thread name this prints the seconds sampled (``count / rate``; the threads of one name, such
as a pool's, summed), and for the threads named by
``--thread`` (substrings) the functions by the seconds of the stacks they are in (inclusive).
Recorded with ``--gil``, only the thread holding the interpreter lock is sampled, so a thread's
seconds are the time it held the lock; with ``--idle``, every thread is sampled at every tick,
waiting or not. ``tools/device/scale_runs.sh`` part e records both.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import re
from pathlib import Path


def stacks(path: Path, process: str):
    """``(thread, frames, count)`` of each raw line whose process matches ``process``."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            frames = stack.split(";")
            if len(frames) < 3 or process not in frames[1]:
                continue
            yield frames[2], frames[3:], int(count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", type=Path)
    parser.add_argument("--process", default="", help="a substring of the process's command")
    parser.add_argument("--rate", type=float, default=100.0, help="py-spy's -r (samples/s)")
    parser.add_argument("--thread", action="append", default=[], help="threads to break down")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    per_thread: collections.Counter[str] = collections.Counter()
    inclusive: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for thread, frames, count in stacks(args.raw, args.process):
        name = thread.split(": ", 1)[-1]  # "thread (1408): MainThread" -> "MainThread"
        per_thread[name] += count
        if any(wanted in name for wanted in args.thread):
            for function in dict.fromkeys(re.sub(r":\d+\)", ")", f) for f in frames):
                inclusive[name][function] += count
    print("| thread | seconds sampled |\n| --- | --- |")
    for name, count in per_thread.most_common():
        print(f"| {name} | {count / args.rate:.2f} |")
    for name, functions in inclusive.items():
        print(f"\n{name}: seconds in stacks holding each function")
        for function, count in functions.most_common(args.top):
            print(f"{count / args.rate:8.2f}  {function}")


if __name__ == "__main__":
    main()
