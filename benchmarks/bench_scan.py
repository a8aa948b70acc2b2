# SPDX-License-Identifier: Apache-2.0
"""Scan a synthetic 2,000-function host and compare, in the same run, with what a user
would otherwise type: the classic shell loop over /sys/kernel/iommu_groups calling
`lspci -nns` per device, and one `lspci -nn`. All read the same tree; each is a whole
process started cold (interpreter start and imports included). `passthrough scan` and
`lspci` run alternately, so they see the same machine load; each is reported with its
median and fastest wall time and its median CPU time (user + system: what load on a shared
machine does not inflate), as multiples of one `lspci -nn`. The "regular install" row runs
the same checkout from a fresh venv, without the editable-install finder this
development venv's `site` imports at every start.

    python benchmarks/bench_scan.py [--ports 111] [--runs 15] [--loop-runs 2] [--json]

Not a test: it prints a table (and --json) for docs/benchmarks.md and the README.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import synthetic
from timing import ENV, alternate, print_summary, regular_install, summary

SHELL_LOOP = r"""
for d in "$ROOT"/sys/kernel/iommu_groups/*/devices/*; do
    n=${d#*/iommu_groups/}; n=${n%%/*}
    printf 'IOMMU Group %s ' "$n"
    lspci -A linux-sysfs -O sysfs.path="$ROOT/sys/bus/pci" -nns "${d##*/}"
done
"""
LSPCI = "lspci -nn (one call)"
LOOP = "shell loop + lspci -nns per device"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--ports", type=int, default=111, help="root ports per domain (8 functions each)"
    )
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--loop-runs", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    lspci = shutil.which("lspci")
    if lspci is None:
        sys.exit("lspci (pciutils) is required")
    script = Path(sys.executable).with_name("passthrough")
    ours = [str(script)] if script.exists() else [sys.executable, "-m", "passthrough"]
    with tempfile.TemporaryDirectory() as tmp:
        root, functions = synthetic.build(Path(tmp) / "host", args.ports)
        scan = ["scan", "--root", str(root)]
        commands = {
            "passthrough scan --json": [*ours, *scan, "--json"],
            "passthrough scan --json, regular install": [
                *(str(regular_install(tmp)), "-m", "passthrough"),
                *scan,
                "--json",
            ],
            "passthrough scan (tree)": [*ours, *scan, "--color", "never"],
            LSPCI: [lspci, "-A", "linux-sysfs", "-O", f"sysfs.path={root}/sys/bus/pci", "-nn"],
        }
        report: dict[str, object] = {
            "functions": functions,
            "runs": args.runs,
            **summary(alternate(commands, args.runs), LSPCI),
        }
        # minutes, not milliseconds: fewer runs, on its own
        loop = alternate(
            {LOOP: ["bash", "-c", SHELL_LOOP]}, args.loop_runs, {**ENV, "ROOT": str(root)}
        )
    ours_json = report["median_seconds"]["passthrough scan --json"]  # type: ignore[index]
    report["shell_loop_median_seconds"] = round(loop.median(LOOP), 3)
    report["speedup_vs_shell_loop"] = round(loop.median(LOOP) / ours_json, 1)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"synthetic host: {functions} PCI functions, {args.runs} alternating runs each")
    print_summary(report)  # type: ignore[arg-type]
    print(f"{LOOP:<44} {loop.median(LOOP):8.2f}s ({args.loop_runs} runs)")
    print(
        f"\npassthrough scan --json: {report['speedup_vs_shell_loop']}x faster than the shell "
        f"loop, {report['ratio']['passthrough scan --json']}x one lspci -nn"  # type: ignore[index]
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
