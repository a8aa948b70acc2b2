# SPDX-License-Identifier: Apache-2.0
"""The host role over ten local hosts against an empty play, in one run.

Each host is a sample root (consumer-intel) reached through Ansible's local connection, as
tests/test_ansible.py makes them, and each starts bare: the system's python3 (no passthrough
on it) and a venv path of its own, so the collection installs the controller's library the
first time. Timed, each a whole ansible-playbook process (forks 2 by default):

  empty play        a play that only pings every host (one module round trip per host)
  host role no-op   playbooks/host.yml when there is nothing to do (run alternately with
                    the empty play, so both see the same machine load)
  first run         fresh roots and fresh venvs: builds the controller's wheel, installs it
                    on every host and applies; and on fresh roots with the venvs already
                    there, which leaves the install cost as the difference

    python benchmarks/bench_fleet.py [--hosts 10] [--forks 2] [--runs 5] [--json]

Not a test: it prints a table (and --json) for docs/fleet.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from timing import ENV, alternate, print_summary, run_once, summary

from passthrough import fakehost

REPO = Path(__file__).parents[1]
BIN = Path(sys.executable).parent
PING = [{"name": "empty", "hosts": "gpu_hosts", "gather_facts": False, "tasks": [{"ping": {}}]}]


def _fleet(tmp: Path, hosts: int, tag: str) -> Path:
    """``hosts`` fresh roots and an inventory naming them; venvs under ``tmp``/venvs."""
    entries = {}
    for i in range(hosts):
        root = fakehost.build(fakehost.load("consumer-intel"), tmp / f"{tag}-{i:02d}")
        entries[f"host-{i:02d}"] = {
            "ansible_connection": "local",
            "ansible_python_interpreter": "/usr/bin/python3",
            "passthrough_root": str(root),
            "passthrough_runtime_venv": str(tmp / "venvs" / f"host-{i:02d}"),
        }
    inv = tmp / f"{tag}.json"
    inv.write_text(json.dumps({"gpu_hosts": {"hosts": entries}}))
    return inv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=10)
    ap.add_argument("--forks", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="passthrough-bench-fleet-"))
    env = {**ENV, "XDG_CACHE_HOME": str(tmp / "cache"), "ANSIBLE_NOCOLOR": "1"}
    env.pop("ANSIBLE_CONFIG", None)
    try:
        (tmp / "ping.yml").write_text(json.dumps(PING))
        play = [str(BIN / "ansible-playbook"), "--forks", str(args.forks), "-i"]
        first = _fleet(tmp, args.hosts, "first")
        install_and_apply = run_once([*play, str(first), str(REPO / "playbooks/host.yml")], env)
        second = _fleet(tmp, args.hosts, "second")  # fresh roots, the venvs kept
        apply_only = run_once([*play, str(second), str(REPO / "playbooks/host.yml")], env)
        samples = alternate(
            {
                "empty play (ping)": [*play, str(first), str(tmp / "ping.yml")],
                "host role, nothing to do": [*play, str(first), str(REPO / "playbooks/host.yml")],
            },
            args.runs,
            env,
        )
        report = summary(samples, "empty play (ping)")
        report["first_run_seconds"] = {
            "install and apply (wheel built, fresh venvs)": round(install_and_apply[0], 2),
            "apply only (venvs there)": round(apply_only[0], 2),
            "install cost": round(install_and_apply[0] - apply_only[0], 2),
        }
        report["setup"] = {"hosts": args.hosts, "forks": args.forks, "runs": args.runs}
        report["per_host_seconds"] = {
            k: round(v / args.hosts, 3) for k, v in report["median_seconds"].items()
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"{args.hosts} local hosts, forks {args.forks}, {args.runs} runs each (cpus: {os.cpu_count()})"
    )
    print_summary(report)
    for label, seconds in report["first_run_seconds"].items():
        print(f"first run: {label:<46} {seconds:6.2f}s")


if __name__ == "__main__":
    main()
