"""Write a larger (or smaller) variant of falconet's synthetic ``shapes`` set anywhere.

    uv run python tools/make_shapes.py /data/shapes-10k --train 10000 --val 1000 --size 640

Then train on it with ``data=/data/shapes-10k/shapes.yaml``. Same seed, same set.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from falconet.data.shapes import write_shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--train", type=int, default=320)
    parser.add_argument("--val", type=int, default=80)
    parser.add_argument("--size", type=int, default=256, help="image side in pixels")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    yaml_path = write_shapes(
        args.folder, {"train": args.train, "val": args.val}, args.size, args.seed
    )
    print(f"wrote {args.train} + {args.val} images; data={yaml_path}")


if __name__ == "__main__":
    main()
