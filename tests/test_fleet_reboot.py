# SPDX-License-Identifier: Apache-2.0
"""host.yml's limit on hosts rebooting at once (passthrough_reboot_max) and its reboot window.

Real ansible-playbook over sample roots reached with the local connection. A sample root is
not rebooted by the play (the role reboots only "/"); passthrough_host_reboot_command stands in
for the reboot there, under the same throttle as the real one. Here that command is a STAND-IN
REBOOT (a real reboot cannot happen in a test): a script that records when each host's
"reboot" starts and ends, holding it for a moment, so the test can count how many overlap."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from passthrough.provision.runner import run, summary_table
from tests.test_ansible import _inventory, _root

pytestmark = pytest.mark.fleet

STANDIN = """import sys, time
log, host = sys.argv[1:]
with open(log, "a") as f:
    f.write(f"{host} start {time.time()}\\n")
time.sleep(1.5)
with open(log, "a") as f:
    f.write(f"{host} end {time.time()}\\n")
"""


def _fleet(tmp_path: Path, count: int, **extra: object) -> tuple[Path, Path]:
    """``count`` consumer-intel hosts that may reboot, each rebooting through the stand-in,
    which appends to the returned log."""
    tmp_path.mkdir(exist_ok=True)
    script, log = tmp_path / "standin_reboot.py", tmp_path / "reboots.log"
    script.write_text(STANDIN)
    hosts = {
        f"host-{i}": {
            "passthrough_root": str(_root(tmp_path, f"r{i}", "consumer-intel")),
            "passthrough_reboot_ok": True,
            "passthrough_host_libvirt_uri": "",
            "passthrough_host_reboot_command": [sys.executable, str(script), str(log), f"host-{i}"],
            **extra,
        }
        for i in range(count)
    }
    return _inventory(tmp_path, hosts), log


def _intervals(log: Path) -> dict[str, tuple[float, float]]:
    seen: dict[str, dict[str, float]] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        host, what, when = line.split()
        seen.setdefault(host, {})[what] = float(when)
    return {h: (t["start"], t["end"]) for h, t in seen.items()}


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    """The largest number of spans open at one moment (each span's start is such a moment)."""
    return max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans)


def test_at_most_reboot_max_hosts_reboot_at_once(tmp_path: Path) -> None:
    """Four hosts in one batch (passthrough_canary=4), four forks, passthrough_reboot_max=2:
    every host reboots, never more than two at once, and two do overlap (the forks run the
    batch side by side: without the limit all four would)."""
    inv, log = _fleet(tmp_path, 4)
    extravars = {"passthrough_canary": 4, "passthrough_reboot_max": 2}
    result = run(str(inv), "host.yml", forks=4, extravars=extravars)
    assert result.ok, summary_table(result)
    spans = _intervals(log)
    assert sorted(spans) == [f"host-{i}" for i in range(4)]
    assert _most_at_once(list(spans.values())) == 2, spans
    # the summary says what happened: written, restarted by the command, not verified
    assert {h.status for h in result.hosts.values()} == {"rebooted"}, summary_table(result)
    assert not any(h.reboot_required for h in result.hosts.values())
    canary = [n for n in result.notes() if n.startswith("canary ")]
    assert len(canary) == 4 and all("ran in place of the reboot" in n for n in canary)


def test_outside_the_reboot_window_no_host_reboots(tmp_path: Path) -> None:
    """A window that starts an hour from now (spanning midnight where it must): the play refuses
    the host before its plan is applied, and the stand-in reboot never runs; inside the window
    it does."""
    now = datetime.now(UTC)
    window = "-".join(f"{(now.hour + h) % 24:02d}:{now.minute:02d}" for h in (1, 2))
    inv, log = _fleet(tmp_path, 1, passthrough_reboot_window=window)
    result = run(str(inv), "host.yml")
    assert not result.ok
    assert f"outside {window} (passthrough_host_reboot_window)" in (
        result.hosts["host-0"].reason or ""
    ), summary_table(result)
    assert _intervals(log) == {}
    root = tmp_path / "r0"
    assert not (root / "etc/default/grub.d/99-passthrough.cfg").exists()
    inside = f"{now.hour:02d}:00-{(now.hour + 1) % 24:02d}:00"
    inv, log = _fleet(tmp_path / "in", 1, passthrough_reboot_window=inside)
    assert run(str(inv), "host.yml").ok
    assert list(_intervals(log)) == ["host-0"]
