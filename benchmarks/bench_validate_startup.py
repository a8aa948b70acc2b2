"""Start-up: validating one file in its own process (what a per-file CI or pre-commit hook
pays each time) — `passthrough-validate FILE` (the lean entry point) and `passthrough validate
FILE` — against `virt-xml-validate FILE domain` on the same file, run alternately so all see
the same machine load. Reports per command the median wall time, the fastest run, and the
median CPU time (user + system of the process: what load on a shared runner does not
inflate), each also as a multiple of virt-xml-validate's.

    python benchmarks/bench_validate_startup.py [--runs 30] [--json]

Not a test: it prints a table (and --json) for the README.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).parents[1]
GOLDEN = REPO / "tests" / "golden" / "vm" / "consumer-2fn.xml"


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


# As installed by pip (which compiles every module): byte code cached, so the untimed
# warm-up run writes it even where the environment turns that off.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
ENV["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))


def _time(argv: list[str]) -> tuple[float, float]:
    """(wall, cpu) seconds of one run."""
    cpu0, start = _cpu(), time.perf_counter()
    r = subprocess.run(argv, capture_output=True, check=False, env=ENV)
    elapsed, cpu = time.perf_counter() - start, _cpu() - cpu0
    if r.returncode != 0:
        sys.exit(f"{argv[0]} failed: {r.stderr.decode(errors='replace').strip()}")
    return elapsed, cpu


def _regular_install(tmp: str, wrapper: Path) -> list[str]:
    """The lean entry point as a regular (non-editable) install runs it: a fresh venv whose
    site-packages lists this checkout and our site-packages in a .pth file — no editable
    install finder for `site` to import at every start (in this venv it costs more than
    the schema)."""
    import sysconfig
    import venv

    env_dir = Path(tmp) / "regular"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "passthrough-checkout.pth").write_text(
        f"{REPO}\n{sysconfig.get_paths()['purelib']}\n"
    )
    return [str(python), str(wrapper)]


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
                *_regular_install(tmp, _wrapper(tmp)),
                args.file,
            ],
            "passthrough validate FILE": [*ours, "validate", args.file],
            "virt-xml-validate FILE domain": ["virt-xml-validate", args.file, "domain"],
        }
        for argv in commands.values():  # warm the page cache once, untimed
            _time(argv)
        wall: dict[str, list[float]] = {k: [] for k in commands}
        cpu: dict[str, list[float]] = {k: [] for k in commands}
        for _ in range(args.runs):
            for label, argv in commands.items():
                w, c = _time(argv)
                wall[label].append(w)
                cpu[label].append(c)
    base = "virt-xml-validate FILE domain"
    med_wall = {k: statistics.median(v) for k, v in wall.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    report = {
        "runs": args.runs,
        "median_seconds": {k: round(v, 4) for k, v in med_wall.items()},
        "min_seconds": {k: round(min(v), 4) for k, v in wall.items()},
        "median_cpu_seconds": {k: round(v, 4) for k, v in med_cpu.items()},
        "ratio_to_virt_xml_validate": {
            k: round(v / med_wall[base], 2) for k, v in med_wall.items()
        },
        "cpu_ratio_to_virt_xml_validate": {
            k: round(v / med_cpu[base], 2) for k, v in med_cpu.items() if med_cpu[base] > 0
        },
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"one file per process, {args.runs} alternating runs each")
    print(f"{'':<44} {'median':>9} {'fastest':>9} {'x':>5} {'CPU':>9} {'x':>5}")
    for label in wall:
        print(
            f"{label:<44} {report['median_seconds'][label] * 1000:7.1f}ms"
            f" {report['min_seconds'][label] * 1000:7.1f}ms"
            f" {report['ratio_to_virt_xml_validate'][label]:5.1f}"
            f" {report['median_cpu_seconds'][label] * 1000:7.1f}ms"
            f" {report['cpu_ratio_to_virt_xml_validate'].get(label, 0):5.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
