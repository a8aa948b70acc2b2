# SPDX-License-Identifier: Apache-2.0
"""Start-up: validating one file in its own process (what a per-file CI or pre-commit hook
pays each time) — `passthrough-validate FILE` (the lean entry point) and `passthrough validate
FILE` — against `virt-xml-validate FILE domain` on the same file, run alternately so all see
the same machine load. Reports per command the median wall time, the fastest run, and the
median CPU time (user + system of the process: what load on a shared runner does not
inflate), each also as a multiple of virt-xml-validate's.

    python benchmarks/bench_validate_startup.py [--runs 30] [--json]

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
from timing import REPO, alternate, print_summary, regular_install, summary

GOLDEN = REPO / "tests" / "golden" / "vm" / "consumer-2fn.xml"


def _lean_entry(tmp: str) -> list[str]:
    """The installed passthrough-validate, or the same three lines pip would write for it
    (an older editable install may predate the entry point)."""
    script = Path(sys.executable).with_name("passthrough-validate")
    if script.exists():
        return [str(script)]
    return [sys.executable, str(_wrapper(tmp))]


def _wrapper(tmp: str) -> Path:
    wrapper = Path(tmp) / "passthrough-validate"
    wrapper.write_text(
        "import sys\nfrom passthrough.vm.validate.main import main\nsys.exit(main())\n"
    )
    return wrapper


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--file", default=str(GOLDEN), help="domain XML to validate")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if shutil.which("virt-xml-validate") is None:
        sys.exit("virt-xml-validate (libvirt-clients) is required")
    script = Path(sys.executable).with_name("passthrough")
    ours = [str(script)] if script.exists() else [sys.executable, "-m", "passthrough"]
    with tempfile.TemporaryDirectory() as tmp:
        commands = {
            "passthrough-validate FILE": [*_lean_entry(tmp), args.file],
            "passthrough-validate FILE, regular install": [
                str(regular_install(tmp)),
                str(_wrapper(tmp)),
                args.file,
            ],
            "passthrough validate FILE": [*ours, "validate", args.file],
            "virt-xml-validate FILE domain": ["virt-xml-validate", args.file, "domain"],
        }
        samples = alternate(commands, args.runs)
    report = {"runs": args.runs, **summary(samples, "virt-xml-validate FILE domain")}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"one file per process, {args.runs} alternating runs each (x: virt-xml-validate's)")
    print_summary(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
