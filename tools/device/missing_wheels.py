"""Download the third-party wheels the GPU machine lacks, for its Python 3.12 on x86-64.

Reads the runtime requirements of the wheels in ``WHEEL_DIR`` (the project's own, built by
prepare.sh), drops those already installed on the GPU machine (device-packages.txt) and the
project's own packages, and downloads the rest, with their dependencies, as binary wheels into
``WHEEL_DIR``. Usage: ``python tools/device/missing_wheels.py .whl``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

HERE = Path(__file__).parent
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def device_packages() -> set[str]:
    lines = (HERE / "device-packages.txt").read_text().splitlines()
    return {canonical(line) for line in lines if line.strip() and not line.startswith("#")}


def wheel_metadata(wheel: Path) -> tuple[str, list[str]]:
    """The distribution name and its unconditional requirements (extras left out)."""
    with zipfile.ZipFile(wheel) as archive:
        meta_name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(archive.read(meta_name).decode())
    requirements = [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]
    return meta["Name"], requirements


def requirement_name(requirement: str) -> str:
    return canonical(re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0))


CARRIED_APART = {"transformer-engine"}
"""Provided by tools/device/te_install.sh from its own archive (too large for .whl as is)."""


def missing(wheels: list[Path], known: set[str]) -> list[str]:
    """The requirements of ``wheels`` that no name in ``known`` satisfies."""
    return sorted(
        {
            requirement.split(";")[0].strip()
            for wheel in wheels
            for requirement in wheel_metadata(wheel)[1]
            if requirement_name(requirement) not in known
        }
    )


def download(requirements: list[str], into: Path) -> list[Path]:
    """Binary wheels of ``requirements`` alone (no dependencies: the caller resolves those
    against what the GPU machine has, so that a wheel that needs torch does not bring a second
    torch and its CUDA libraries)."""
    before = set(into.glob("*.whl"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--implementation",
            "cp",
            "-d",
            str(into),
            *[arg for p in PLATFORMS for arg in ("--platform", p)],
            *requirements,
        ],
        check=True,
    )
    return sorted(set(into.glob("*.whl")) - before)


def main(wheel_dir: Path) -> None:
    present = device_packages() | CARRIED_APART
    own = list(wheel_dir.glob("*.whl"))
    known = present | {canonical(wheel_metadata(w)[0]) for w in own}
    wanted = missing(own, known)
    if not wanted:
        print("missing_wheels: the GPU machine has every third-party requirement already")
        return
    while wanted:  # each round: the wheels asked for, then what they need that is not there
        fetched = download(wanted, wheel_dir)
        known |= {canonical(wheel_metadata(w)[0]) for w in fetched}
        for wheel in fetched:
            print(f"missing_wheels: {wheel.name}")
        wanted = missing(fetched, known)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
