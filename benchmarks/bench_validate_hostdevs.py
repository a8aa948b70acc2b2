# SPDX-License-Identifier: Apache-2.0
"""`passthrough validate` on one domain with 10,000 <hostdev>, beside `virt-xml-validate`
on the same file: the valid file, and the same file with one bad <hostdev> in the middle
(where passthrough also finds the element at fault, which took minutes while it
re-validated the document once per child). Then the growth with every <hostdev> failing
(no source address: a schema fault and a finding each), at a quarter, half and all of
--hostdevs side by side: linear, where it was quadratic (10,000 took 9.7 s of CPU).

    python benchmarks/bench_validate_hostdevs.py [--hostdevs 10000] [--runs 3] [--json]

"ours" is passthrough's CPU time less one RelaxNG validation of the file by libxml2 (what
virt-xml-validate spends too), measured in this process. Not a test: it prints a table
(and --json) for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timing import ENV

HOSTDEV = (
    "<hostdev mode='subsystem' type='pci' managed='yes'><source>"
    "<address domain='0x{d:04x}' bus='0x{b:02x}' slot='0x{s:02x}' function='0x0'/>"
    "</source></hostdev>"
)


def domain(n: int, bad_at: int | None = None) -> str:
    """A minimal KVM domain with ``n`` distinct PCI hostdevs; ``bad_at``: one with an
    attribute the schema rejects at that index."""
    devs = [HOSTDEV.format(d=i // 8192, b=(i // 32) % 256, s=i % 32) for i in range(n)]
    if bad_at is not None:
        devs[bad_at] = devs[bad_at].replace("<hostdev ", "<hostdev bogus='1' ", 1)
    return (
        "<domain type='kvm'><name>big</name><memory unit='KiB'>1048576</memory><vcpu>2</vcpu>"
        "<os><type arch='x86_64' machine='q35'>hvm</type></os>"
        f"<devices>{''.join(devs)}</devices></domain>\n"
    )


def all_failing(n: int) -> str:
    """A domain whose ``n`` PCI hostdevs all fail: none has a source address."""
    devs = "<hostdev mode='subsystem' type='pci' managed='yes'><source/></hostdev>" * n
    return domain(0).replace("<devices></devices>", f"<devices>{devs}</devices>")


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall, cpu) seconds of one run; a file found invalid counts (passthrough exits 1,
    virt-xml-validate 3), any other failure ends the benchmark."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode not in (0, 1, 3):
        sys.exit(f"{argv[0]} failed: {r.stderr.decode(errors='replace').strip()}")
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def libxml2_seconds(path: Path, runs: int) -> float:
    """One RelaxNG validation of ``path`` with libvirt's schema, median of ``runs``."""
    from lxml import etree

    from passthrough.vm.validate.schema import load

    rng = load(None).rng()
    doc = etree.parse(str(path))
    times = []
    for _ in range(runs):
        start = time.process_time()
        rng.validate(doc)
        times.append(time.process_time() - start)
    return statistics.median(times)


def measure(path: Path, runs: int, passthrough: str) -> dict[str, float]:
    ours = [timed([passthrough, "validate", str(path)]) for _ in range(runs)]
    theirs = [timed(["virt-xml-validate", str(path), "domain"]) for _ in range(runs)]
    cpu = statistics.median(c for _w, c in ours)
    return {
        "passthrough_wall": statistics.median(w for w, _c in ours),
        "passthrough_cpu": cpu,
        "virt_xml_validate_wall": statistics.median(w for w, _c in theirs),
        "virt_xml_validate_cpu": statistics.median(c for _w, c in theirs),
        "libxml2_relaxng_cpu": (rng := libxml2_seconds(path, runs)),
        "ours_cpu": cpu - rng,
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--hostdevs", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if shutil.which("virt-xml-validate") is None:
        sys.exit("virt-xml-validate (libvirt-clients) is required")
    passthrough = shutil.which("passthrough") or str(Path(sys.executable).with_name("passthrough"))
    report: dict[str, object] = {"hostdevs": args.hostdevs, "runs": args.runs}
    with tempfile.TemporaryDirectory() as tmp:
        for name, bad in (("valid", None), ("one_bad_hostdev", args.hostdevs // 2)):
            path = Path(tmp) / f"{name}.xml"
            path.write_text(domain(args.hostdevs, bad))
            report[name] = {"bytes": path.stat().st_size, **measure(path, args.runs, passthrough)}
        growth: dict[str, float] = {}
        for times in (1, 2, 4):
            n = max(1, args.hostdevs * times // 4)
            path = Path(tmp) / f"failing-{n}.xml"
            path.write_text(all_failing(n))
            runs = [timed([passthrough, "validate", str(path)]) for _ in range(args.runs)]
            growth[str(n)] = statistics.median(c for _w, c in runs)
        report["all_failing_cpu"] = growth
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{args.hostdevs} <hostdev>, median of {args.runs} runs (seconds)")
    for name in ("valid", "one_bad_hostdev"):
        r = report[name]
        assert isinstance(r, dict)
        print(
            f"  {name:16} passthrough {r['passthrough_wall']:.2f} wall / "
            f"{r['passthrough_cpu']:.2f} cpu (ours {r['ours_cpu']:.2f}, libxml2 "
            f"{r['libxml2_relaxng_cpu']:.2f}); virt-xml-validate "
            f"{r['virt_xml_validate_wall']:.2f} wall / {r['virt_xml_validate_cpu']:.2f} cpu"
        )
    growth = report["all_failing_cpu"]
    assert isinstance(growth, dict)
    print("every <hostdev> failing, passthrough cpu (1x, 2x, 4x):")
    print("  " + "   ".join(f"{n:>6} hostdevs {cpu:.2f} s" for n, cpu in growth.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
