# SPDX-License-Identifier: Apache-2.0
"""`passthrough validate` on 1,000 generated domain files in one process, against
`virt-xml-validate` run on each file (what a CI job would otherwise loop over), same
files, same run. passthrough also runs its policy layer on every file.

    python benchmarks/bench_validate.py [--files 1000] [--json]

Not a test: it prints a table (and --json) for docs/benchmarks.md and the README.
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

from passthrough import fakehost
from passthrough.host.discover import discover
from passthrough.vm.render import render
from passthrough.vm.spec import VmOptions, build_spec

GPUS = ("18:00.0", "19:00.0", "3f:00.0", "40:00.0", "9a:00.0", "9b:00.0", "ba:00.0", "bb:00.0")


def rendered_files(dest: Path, count: int, root: Path | None = None) -> list[str]:
    """``count`` domain files rendered for the hgx-h100 sample (built in ``dest`` unless
    ``root`` is given), one H100 each, their sizes varied."""
    dest.mkdir(parents=True, exist_ok=True)
    if root is None:
        root = fakehost.build(fakehost.load("hgx-h100"), dest / "host")
    host = discover(str(root))
    files = []
    for i in range(count):
        opts = VmOptions(
            name=f"vm{i:04d}",
            gpus=(GPUS[i % 8],),
            vcpus=2 + i % 6,
            memory_mib=4096 + 1024 * (i % 8),
        )
        path = dest / f"vm{i:04d}.xml"
        path.write_text(render(build_spec(host, opts)))
        files.append(str(path))
    return files


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if shutil.which("virt-xml-validate") is None:
        sys.exit("virt-xml-validate (libvirt-clients) is required")
    passthrough = shutil.which("passthrough") or str(Path(sys.executable).with_name("passthrough"))
    with tempfile.TemporaryDirectory() as tmp:
        root = fakehost.build(fakehost.load("hgx-h100"), Path(tmp) / "host")
        files = rendered_files(Path(tmp), args.files, root)
        argv = [passthrough, "validate", "--host-root", str(root), *files]
        # as pip installs it, byte code cached: one untimed run writes it where the
        # environment turns that off
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        subprocess.run(argv[:4] + files[:1], capture_output=True, check=False, env=env)
        start = time.perf_counter()
        ours = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
        t_ours = time.perf_counter() - start
        start = time.perf_counter()
        failures = 0
        for f in files:
            r = subprocess.run(["virt-xml-validate", f, "domain"], capture_output=True, check=False)
            failures += r.returncode != 0
        t_loop = time.perf_counter() - start
    report = {
        "files": args.files,
        "seconds": {
            "passthrough validate (schema + policy)": round(t_ours, 3),
            "virt-xml-validate per file": round(t_loop, 3),
        },
        "speedup": round(t_loop / t_ours, 1),
        "passthrough_ok": ours.returncode == 0,
        "virt_xml_validate_failures": failures,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{args.files} domain files (one H100 each, host facts given)")
    for label, seconds in report["seconds"].items():
        print(f"{label:<42} {seconds:>8.2f} s")
    print(f"\npassthrough validate is {report['speedup']}x faster, with the policy layer on top")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
