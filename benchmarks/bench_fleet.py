# SPDX-License-Identifier: Apache-2.0
"""The host role's no-op run against a ping play at several fleet sizes, side by side, in one run.

Each host is a sample root (consumer-intel) reached through Ansible's local connection, as
tests/test_ansible.py makes them (or, with --ssh, over SSH: each host a network namespace with
its own address and sshd, sshfleet.py; as root), with the system's python3 and the collection's venv runtime
(one venv path for every host: they share this machine, and the rolling play's canary installs
it, so every other host goes through the same runtime check a fleet host does, installed). Per
size, each a whole ansible-playbook process (forks 2 by default), run alternately so that both
see the same machine load:

  ping play         a play that only pings every host (one module round trip per host)
  host.yml no-op    playbooks/host.yml, rolling as it ships (a canary, then batches of 5),
                    when there is nothing to do (an untimed first run applied the plan)

Then one no-op run per size under ansible.posix.profile_tasks, whose task times say where the
cost goes (summed over the batches, as a share of the run's task time).

    python benchmarks/bench_fleet.py [--sizes 10,50,100] [--forks 2] [--runs 3] [--ssh] [--json]

Not a test: it prints a table (and --json) for docs/fleet.md, with the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import sshfleet
from timing import ENV, alternate, run_once, summary

from passthrough import fakehost

REPO = Path(__file__).parents[1]
BIN = Path(sys.executable).parent
HOST_PLAY = str(REPO / "playbooks/host.yml")
PING = [{"name": "ping", "hosts": "gpu_hosts", "gather_facts": False, "tasks": [{"ping": {}}]}]
# profile_tasks' line per task: "role : task name ---- 1.23s"
TASK_TIME = re.compile(r"^(.*?) -{2,} (\d+\.\d+)s$")


def _fleet(tmp: Path, hosts: int, ssh: dict[str, str] | None = None) -> Path:
    """``hosts`` fresh roots and an inventory naming them, one venv path for all; reached
    through the local connection, or over SSH (``ssh``: the client's settings, each host at
    its own address, sshfleet.py)."""
    template = fakehost.build(fakehost.load("consumer-intel"), tmp / "template")
    entries = {}
    for i in range(hosts):
        root = tmp / f"h{hosts}-{i:03d}"
        shutil.copytree(template, root, symlinks=True)
        how: dict[str, str] = (
            {"ansible_connection": "local"}
            if ssh is None
            else {**ssh, "ansible_connection": "ssh", "ansible_host": sshfleet.address(i)}
        )
        entries[f"host-{i:03d}"] = {
            **how,
            "ansible_python_interpreter": "/usr/bin/python3",
            "passthrough_root": str(root),
            "passthrough_runtime_venv": str(tmp / "venv"),
        }
    inv = tmp / f"fleet-{hosts}.json"
    inv.write_text(json.dumps({"gpu_hosts": {"hosts": entries}}))
    return inv


def _profile(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    """Seconds per task name of one run under profile_tasks, summed over the batches."""
    env = {**env, "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks"}
    env["PROFILE_TASKS_TASK_OUTPUT_LIMIT"] = "all"
    out = subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout
    tasks: dict[str, float] = defaultdict(float)
    recap = out.split("TASKS RECAP")[-1].splitlines()
    for line in recap:
        if m := TASK_TIME.match(line.strip()):
            tasks[m.group(1).split(" : ")[-1].strip()] += float(m.group(2))
    return dict(tasks)


def measure(
    tmp: Path,
    hosts: int,
    forks: int,
    runs: int,
    env: dict[str, str],
    ssh: dict[str, str] | None = None,
) -> dict[str, Any]:
    tmp.mkdir()
    load_before = [round(x, 2) for x in os.getloadavg()]
    inv = str(_fleet(tmp, hosts, ssh))
    play = [str(BIN / "ansible-playbook"), "--forks", str(forks), "-i", inv]
    first = run_once([*play, HOST_PLAY], env)  # installs the venv (canary) and applies
    samples = alternate(
        {"ping play": [*play, str(tmp.parent / "ping.yml")], "host.yml no-op": [*play, HOST_PLAY]},
        runs,
        env,
    )
    report: dict[str, Any] = dict(summary(samples, "ping play"))
    report["per_host_seconds"] = {
        k: round(v / hosts, 3) for k, v in report["median_seconds"].items()
    }
    report["first_run_seconds"] = round(first[0], 1)
    report["load_average_before"] = load_before
    report["load_average"] = [round(x, 2) for x in os.getloadavg()]
    tasks = _profile([*play, HOST_PLAY], env)
    total = sum(tasks.values()) or 1.0
    top = sorted(tasks.items(), key=lambda kv: -kv[1])[:5]
    report["task_share"] = {name: round(sec / total, 2) for name, sec in top}
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10,50,100", help="host counts, comma-separated")
    ap.add_argument("--forks", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--ssh",
        action="store_true",
        help="reach the hosts over SSH, each in a network namespace of its own (root, sshd)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.ssh and (why := sshfleet.missing()):
        sys.exit(f"--ssh: {why}")
    # a kill (timeout, Ctrl-C) unwinds like an exit: the namespaces and daemons go away
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = Path(tempfile.mkdtemp(prefix="passthrough-bench-fleet-"))
    env = {**ENV, "XDG_CACHE_HOME": str(tmp / "cache"), "ANSIBLE_NOCOLOR": "1"}
    env.pop("ANSIBLE_CONFIG", None)
    sizes = [int(s) for s in args.sizes.split(",")]
    reports: dict[str, Any] = {"setup": {"forks": args.forks, "runs": args.runs, "ssh": args.ssh}}
    try:
        (tmp / "ping.yml").write_text(json.dumps(PING))
        for hosts in sizes:
            with contextlib.ExitStack() as stack:
                ssh = (
                    stack.enter_context(sshfleet.hosts(hosts, tmp / f"ssh{hosts}"))
                    if args.ssh
                    else None
                )
                reports[str(hosts)] = measure(
                    tmp / str(hosts), hosts, args.forks, args.runs, env, ssh
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(reports, indent=2))
        return
    how = "over SSH, a network namespace per host" if args.ssh else "local connection"
    print(f"{how}, forks {args.forks}, {args.runs} alternating runs each (cpus: {os.cpu_count()})")
    print(
        f"{'hosts':>5} {'ping':>8} {'no-op':>8} {'x wall':>7} {'x CPU':>6} {'/host':>7}  load (before, after)"
    )
    for hosts in sizes:
        r = reports[str(hosts)]
        med, ratio = r["median_seconds"], r["ratio"]
        print(
            f"{hosts:>5} {med['ping play']:7.1f}s {med['host.yml no-op']:7.1f}s"
            f" {ratio['host.yml no-op']:7.2f} {r['cpu_ratio'].get('host.yml no-op', 0):6.2f}"
            f" {r['per_host_seconds']['host.yml no-op']:6.2f}s"
            f"  {r['load_average_before']} {r['load_average']}"
        )
        print("        where the no-op's task time goes: " + json.dumps(r["task_share"]))


if __name__ == "__main__":
    main()
