# SPDX-License-Identifier: Apache-2.0
"""Every speed figure of issue 34 beside its reference, in one run on one machine, so the
ratios hold however loaded the machine is:

- start-up: `passthrough --version` beside the bare interpreter (`python -c pass`);
- scan: `passthrough scan --json` on synthetic hosts of 2,000, 4,000 and 8,000 functions,
  each beside one `lspci -nn` on the same tree, and how each grows against 2,000;
- validate one file per process (`passthrough-validate FILE`, `passthrough validate FILE`)
  beside `virt-xml-validate FILE domain`;
- validate a batch (one `passthrough validate` over N rendered files, schema and policy;
  and with --schema-only) beside a `virt-xml-validate` loop over the same files.

Beside each, its floor (benchmarks/floors.py): the same work done by the least Python
program that can do it — scan's reads with nothing parsed, the interpreter with lxml and
libvirt's schema compiled, lxml's parse and RelaxNG over the batch in the same workers. A
goal below its floor is out of reach of any Python tool; the distance from the floor is ours.

Our commands run from a regular install of this checkout (timing.regular_install: no
editable-install finder at start), both as ``python -m passthrough`` and as the console script
pip writes (``passthrough``: no runpy, the installed entry point's cost); commands of one
table alternate so they share the load.
Wall time is a median; CPU time (user + system of the process) is what load inflates least.

    python benchmarks/bench_speed.py [--runs 15] [--sizes 2000,4000,8000] [--batch 500] [--json]

Not a test: it prints the tables (and --json) that docs/benchmarks.md and the README quote.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import synthetic
from bench_validate_startup import GOLDEN, _wrapper
from timing import ENV, alternate, print_summary, regular_install, summary

LSPCI = "lspci -nn (one call)"
# floors (benchmarks/floors.py): what any Python program pays for the same work
FLOORS = Path(__file__).parent / "floors.py"
READS = "floor: the same reads in bare Python"
SCHEMA = "floor: python, lxml, libvirt's schema compiled"
LXML_ONE = "floor: that, then the file by the schema"
LXML_BATCH = "floor: lxml's parse and RelaxNG alone, same workers"
VIRT = "virt-xml-validate FILE domain"
PYTHON = "python -c pass (the interpreter alone)"


def console_script(tmp: str) -> str:
    """The three lines pip writes for the ``passthrough`` entry point (pyproject.toml)."""
    script = Path(tmp) / "passthrough"
    script.write_text("import sys\nfrom passthrough.cli import main\nsys.exit(main())\n")
    return str(script)


def start_up(python: str, tmp: str, runs: int) -> dict[str, object]:
    commands = {
        "passthrough --version": [python, "-m", "passthrough", "--version"],
        "passthrough --version (console script)": [python, console_script(tmp), "--version"],
        "passthrough scan --help": [python, "-m", "passthrough", "scan", "--help"],
        PYTHON: [python, "-c", "pass"],
    }
    return summary(alternate(commands, runs), PYTHON)


def scan(python: str, tmp: str, sizes: list[int], runs: int) -> dict[str, object]:
    """Each size's figures beside lspci's, and the growth of both against the first size."""
    lspci = shutil.which("lspci")
    if lspci is None:
        sys.exit("lspci (pciutils) is required")
    out: dict[str, object] = {}
    for size in sizes:
        root, functions = synthetic.build_functions(Path(tmp) / f"host{size}", size)
        args = ["scan", "--root", str(root), "--json"]
        commands = {
            "passthrough scan --json": [python, "-m", "passthrough", *args],
            "passthrough scan --json (console script)": [python, console_script(tmp), *args],
            LSPCI: [lspci, "-A", "linux-sysfs", "-O", f"sysfs.path={root}/sys/bus/pci", "-nn"],
            READS: [python, str(FLOORS), "reads", str(root)],
        }
        out[str(functions)] = summary(alternate(commands, runs), LSPCI)
        shutil.rmtree(root)
    first = out[str(sizes[0])]
    for report in out.values():
        for key in ("median_seconds", "median_cpu_seconds"):
            base = first[key]  # type: ignore[index]
            report[f"growth_{key}"] = {  # type: ignore[index]
                k: round(v / base[k], 2)
                for k, v in report[key].items()  # type: ignore[index]
            }
    return out


def one_file(python: str, tmp: str, runs: int) -> dict[str, object]:
    commands = {
        "passthrough-validate FILE": [python, str(_wrapper(tmp)), str(GOLDEN)],
        "passthrough validate FILE": [python, "-m", "passthrough", "validate", str(GOLDEN)],
        "passthrough validate FILE (console script)": [
            python,
            console_script(tmp),
            "validate",
            str(GOLDEN),
        ],
        VIRT: ["virt-xml-validate", str(GOLDEN), "domain"],
        SCHEMA: [python, str(FLOORS), "schema"],
        LXML_ONE: [python, str(FLOORS), "validate", str(GOLDEN)],
    }
    return summary(alternate(commands, runs), VIRT)


def batch(python: str, tmp: str, count: int, runs: int) -> dict[str, object]:
    """One process over ``count`` rendered domains (the median of ``runs``; with
    --schema-only too, and the lxml floor over the same files) against one
    virt-xml-validate each (one loop: it is the long one, and steady)."""
    from bench_validate import rendered_files

    files = rendered_files(Path(tmp) / "batch", count)
    ours = [python, "-m", "passthrough", "validate", *files]
    commands = {
        "passthrough validate FILES": ours,
        "passthrough validate --schema-only FILES": [*ours[:4], "--schema-only", *files],
        LXML_BATCH: [python, str(FLOORS), "validate", *files],
    }
    ok = all(
        subprocess.run(argv, capture_output=True, check=False, env=ENV).returncode == 0
        for argv in commands.values()  # byte code written, and each one passes
    )
    samples = alternate(commands, runs)
    start = time.perf_counter()
    failures = sum(
        subprocess.run(["virt-xml-validate", f, "domain"], capture_output=True).returncode != 0
        for f in files
    )
    t_loop = time.perf_counter() - start
    seconds = {k: round(samples.median(k), 3) for k in commands}
    return {
        "files": count,
        "runs": runs,
        "passthrough_validate_seconds": seconds["passthrough validate FILES"],
        "median_seconds": seconds,
        "virt_xml_validate_loop_seconds": round(t_loop, 3),
        "speedup": round(t_loop / seconds["passthrough validate FILES"], 1),
        "speedups": {k: round(t_loop / v, 1) for k, v in seconds.items()},
        "passthrough_ok": ok,
        "virt_xml_validate_failures": failures,
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--sizes", default="2000,4000,8000", help="PCI functions (1,000s)")
    ap.add_argument("--batch", type=int, default=500, help="files in the validate batch")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if shutil.which("virt-xml-validate") is None:
        sys.exit("virt-xml-validate (libvirt-clients) is required")
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        python = str(regular_install(tmp))
        report = {
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "start_up": start_up(python, tmp, args.runs),
            "scan": scan(python, tmp, sizes, args.runs),
            "validate_one_file": one_file(python, tmp, args.runs),
            "validate_batch": batch(python, tmp, args.batch, max(1, args.runs // 3)),
        }
        report["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"load average {report['load_average']} before, {report['load_average_after']} after")
    print(f"\nstart-up ({args.runs} alternating runs; x: the interpreter alone)")
    print_summary(report["start_up"])  # type: ignore[arg-type]
    for functions, figures in report["scan"].items():  # type: ignore[attr-defined]
        print(f"\nscan, {functions} functions (x: one lspci -nn on the same tree)")
        print_summary(figures)
        growth = figures["growth_median_cpu_seconds"]
        print(
            f"CPU time against {sizes[0]} functions: "
            + ", ".join(f"{k} {v}x" for k, v in growth.items())
        )
    print(f"\nvalidate one file per process (x: {VIRT})")
    print_summary(report["validate_one_file"])  # type: ignore[arg-type]
    b: dict[str, Any] = report["validate_batch"]  # type: ignore[assignment]
    print(
        f"\nvalidate {b['files']} files (median of {b['runs']}), against a virt-xml-validate"
        f" loop of {b['virt_xml_validate_loop_seconds']} s:"
    )
    for label, seconds in b["median_seconds"].items():
        print(f"  {label:<48} {seconds:7.3f} s  {b['speedups'][label]:6.1f}x faster")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
