# SPDX-License-Identifier: Apache-2.0
"""The next-boot read-back of a GRUB default (grubenv's ``saved_entry``) at 1, 2, 4 and 16 MiB,
side by side: the time must grow with the size (1x, 2x, 4x, 16x), not with its square (a
1.6 MB default took 41 s while each step of its ``>`` path was built a character at a time).

Each size is a tree with a grub.cfg whose default is ``${saved_entry}`` and a grubenv whose
saved_entry names no entry (so the whole value is split and looked up); 16 MiB is the most
passthrough reads of one file. What is timed is ``grub.check_grub`` (reading both files
below the root, parsing, resolving the default), in this process, median of ``--runs``.

    python benchmarks/bench_grub_default.py [--sizes 1,2,4,16] [--runs 3] [--json]

Not a test: it prints a table (and --json) for docs/limits.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from passthrough.actions import PlanRecord
from passthrough.boot import grub, readback
from passthrough.host.root import HostRoot

GRUB_CFG = (
    'set default="${saved_entry}"\n'
    "menuentry 'Debian GNU/Linux' --id gnulinux-simple {\n"
    "\tlinux /boot/vmlinuz root=/dev/vda ro iommu=pt\n}\n"
)
PIECE = "Advanced options>>x>"  # a title step with a literal '>' then a separator


def tree(base: Path, mib: int) -> Path:
    root = base / f"{mib}mib"
    (root / "boot/grub").mkdir(parents=True)
    (root / "boot/grub/grub.cfg").write_text(GRUB_CFG)
    head = "saved_entry="
    body = (PIECE * ((mib << 20) // len(PIECE) + 1))[: (mib << 20) - len(head)]
    (root / "boot/grub/grubenv").write_text(head + body)
    return root


def once(root: Path) -> float:
    record = PlanRecord.from_json({"kernel_args": {"set": ["iommu=pt"]}, "bootloader": "grub"})
    out = readback.NextBoot(ran=[["grub-mkconfig", "-o", "/boot/grub/grub.cfg"]])
    start = time.perf_counter()
    grub.check_grub(HostRoot(str(root)), record, out)
    took = time.perf_counter() - start
    if out.checked or not out.unchecked or "names no entry" not in out.unchecked[0]:
        sys.exit(f"unexpected read-back of {root}: {out}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,2,4,16", help="MiB, comma-separated")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    seconds: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-grub-default-") as tmp:
        roots = {mib: tree(Path(tmp), mib) for mib in sizes}
        for mib in sizes:
            seconds[mib] = statistics.median(once(roots[mib]) for _ in range(args.runs))
    first = sizes[0]
    rows = [
        {
            "mib": mib,
            "seconds": round(s, 4),
            "size_ratio": mib / first,
            "time_ratio": round(s / seconds[first], 2),
        }
        for mib, s in seconds.items()
    ]
    if args.json:
        print(json.dumps({"runs": args.runs, "rows": rows}, indent=2))
        return
    print(f"{'default':>9}  {'seconds':>8}  {'size x':>6}  {'time x':>6}")
    for r in rows:
        print(
            f"{r['mib']:>5} MiB  {r['seconds']:>8.3f}  {r['size_ratio']:>6g}  {r['time_ratio']:>6g}"
        )


if __name__ == "__main__":
    main()
