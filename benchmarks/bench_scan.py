"""Scan a synthetic 2,000-function host and compare, in the same run, with what a user
would otherwise type: the classic shell loop over /sys/kernel/iommu_groups calling
`lspci -nns` per device, and one `lspci -nn`. All three read the same tree; each is a
whole process started cold (interpreter start and imports included).

    python benchmarks/bench_scan.py [--functions-per-domain-ports 111] [--runs 5]

Not a test: it prints a table (and --json) for the README.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import synthetic

SHELL_LOOP = r"""
for d in "$ROOT"/sys/kernel/iommu_groups/*/devices/*; do
    n=${d#*/iommu_groups/}; n=${n%%/*}
    printf 'IOMMU Group %s ' "$n"
    lspci -A linux-sysfs -O sysfs.path="$ROOT/sys/bus/pci" -nns "${d##*/}"
done
"""


def timed(cmd: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--ports", type=int, default=111, help="root ports per domain (8 functions each)"
    )
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--loop-runs", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    lspci = shutil.which("lspci")
    if lspci is None:
        sys.exit("lspci (pciutils) is required")
    passthrough = shutil.which("passthrough") or str(Path(sys.executable).with_name("passthrough"))
    with tempfile.TemporaryDirectory() as tmp:
        root, functions = synthetic.build(Path(tmp) / "host", args.ports)
        env = {**os.environ, "ROOT": str(root)}
        cases = {
            "passthrough scan --json": (
                [passthrough, "scan", "--root", str(root), "--json"],
                args.runs,
            ),
            "passthrough scan (tree)": (
                [passthrough, "scan", "--root", str(root), "--color", "never"],
                args.runs,
            ),
            "lspci -nn (one call)": (
                [lspci, "-A", "linux-sysfs", "-O", f"sysfs.path={root}/sys/bus/pci", "-nn"],
                args.runs,
            ),
            "shell loop + lspci -nns per device": (["bash", "-c", SHELL_LOOP], args.loop_runs),
        }
        results = {}
        for label, (cmd, runs) in cases.items():
            timed(cmd, env)  # warm the page cache, as every case gets
            samples = [timed(cmd, env) for _ in range(runs)]
            results[label] = statistics.median(samples)
    scan = results["passthrough scan --json"]
    report = {
        "functions": functions,
        "median_seconds": {k: round(v, 4) for k, v in results.items()},
        "speedup_vs_shell_loop": round(results["shell loop + lspci -nns per device"] / scan, 1),
        "ratio_vs_one_lspci": round(scan / results["lspci -nn (one call)"], 2),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"synthetic host: {functions} PCI functions (median of runs, whole process)")
    print(f"{'command':<40} {'seconds':>9}")
    for label, seconds in results.items():
        print(f"{label:<40} {seconds:>9.3f}")
    print(
        f"\npassthrough scan --json is {report['speedup_vs_shell_loop']}x faster than the shell loop "
        f"and {report['ratio_vs_one_lspci']}x the time of one lspci -nn"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
