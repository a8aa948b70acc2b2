# SPDX-License-Identifier: Apache-2.0
"""Every rollout setting of host.yml honoured wherever Ansible reads variables, or refused
before anything runs; and the summary judged against the files on each host.

Real ansible-playbook through ``passthrough provision`` over sample roots reached with the local
connection (as tests/test_fleet_rolling.py runs them). Before: group_vars' canary and batch were
ignored without a word, 0 and -1 sent a whole batch at once, the window was compared as text,
and the hosts of a batch stopped after their plan were reported "changed, reboot required"."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from passthrough.cli import main
from tests.test_ansible import _inventory, _root
from tests.test_fleet_rolling import _tree

pytestmark = pytest.mark.fleet


def _hosts(tmp_path: Path, count: int, **each: Any) -> tuple[Path, list[Path]]:
    roots = [_root(tmp_path, f"r{i}", "consumer-intel") for i in range(count)]
    hosts = {f"host-{i}": {"passthrough_root": str(r), **each} for i, r in enumerate(roots)}
    return _inventory(tmp_path, hosts), roots


def _provision(inv: Path, tmp_path: Path, *extra: str) -> int:
    argv = ["provision", "-i", str(inv), "--playbook", "host.yml", "--json"]
    return main([*argv, "--log", str(tmp_path / "run.log"), *extra])


def _report(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    out = capsys.readouterr().out
    return dict(json.loads(out)["hosts"]) if out.strip() else {}


def _written(root: Path) -> bool:
    return (root / "etc/default/grub.d/99-passthrough.cfg").exists()


def test_group_vars_canary_and_batch_are_honoured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """group_vars/gpu_hosts.yml: a canary of 2, batches of 3: [0 1] [2 3 4] [5]."""
    inv, roots = _hosts(tmp_path, 6)
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars/gpu_hosts.yml").write_text(
        yaml.safe_dump({"passthrough_canary": 2, "passthrough_batch": 3})
    )
    code = _provision(inv, tmp_path)
    report = _report(capsys)
    assert code == 0, report
    assert [report[f"host-{i}"]["batch"] for i in range(6)] == [1, 1, 2, 2, 2, 3]
    assert {h["status"] for h in report.values()} == {"reboot pending"}
    assert all(_written(r) for r in roots)


def test_plain_ansible_playbook_names_a_group_vars_canary_it_cannot_read(tmp_path: Path) -> None:
    """ansible-playbook reads a play's serial from -e only: with passthrough_canary: 2 in
    group_vars its canary would be one host, silently. The Batch task stops the play, naming
    the setting, before any host is touched; with -e the same run goes."""
    import subprocess
    import sys

    inv, roots = _hosts(tmp_path, 3)
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars/gpu_hosts.yml").write_text("passthrough_canary: 2\n")
    before = [_tree(r) for r in roots]
    book = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inv)]
    book.append(str(Path(__file__).parents[1] / "playbooks/host.yml"))
    r = subprocess.run(book, capture_output=True, text=True, check=False)
    assert r.returncode != 0
    assert "passthrough_canary is 2 for these hosts but this batch has 1" in r.stdout + r.stderr
    assert [_tree(r) for r in roots] == before
    r = subprocess.run([*book, "-e", "passthrough_canary=2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert all(_written(root) for root in roots)


@pytest.mark.parametrize(
    ("where", "name", "value", "shown"),
    [
        ("-e", "passthrough_canary", "0", "passthrough_canary: 0 is not"),
        ("-e", "passthrough_canary", "-1", "passthrough_canary: -1 is not"),
        ("group_vars", "passthrough_batch", 0, "passthrough_batch: 0 is not"),
        ("-e", "passthrough_max_fail_percentage", "-1", "passthrough_max_fail_percentage: -1"),
        (
            "host_vars",
            "passthrough_reboot_window",
            "23:59-1:0",
            "host-1: passthrough_reboot_window",
        ),
        ("group_vars", "passthrough_guests", "kill", "passthrough_guests: kill is not one of"),
    ],
)
def test_a_bad_setting_is_refused_before_anything_runs(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    where: str,
    name: str,
    value: Any,
    shown: str,
) -> None:
    inv, roots = _hosts(tmp_path, 3)
    before = [_tree(r) for r in roots]
    extra: list[str] = []
    if where == "-e":
        extra = ["-e", f"{name}={value}"]
    else:
        folder = tmp_path / where
        folder.mkdir()
        target = "gpu_hosts" if where == "group_vars" else "host-1"
        (folder / f"{target}.yml").write_text(yaml.safe_dump({name: value}))
    code = _provision(inv, tmp_path, *extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("passthrough: error: ") and shown in err[-1], err
    assert not (tmp_path / "run.log").exists()  # Ansible never started
    assert [_tree(r) for r in roots] == before


def _outside_now() -> str:
    """A one-hour window that starts in two hours (one-digit hours as they come)."""
    start = datetime.now(UTC) + timedelta(hours=2)
    end = start + timedelta(hours=1)
    return f"{start.hour}:{start.minute:02d}-{end.hour}:{end.minute:02d}"


def test_a_host_failing_mid_batch_leaves_its_batch_mates_not_started(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reboots allowed, batches of two: [0] [1 2] [3]. Host 2's window is not now: it is
    refused before anything changes, the play stops the batch after the plans, and host 1,
    planned but never applied, is "not started" with its files untouched (before: "changed,
    reboot required"); host 3 is not started either."""
    inv, roots = _hosts(tmp_path, 4, passthrough_reboot_ok=True)
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars/host-2.yml").write_text(
        yaml.safe_dump({"passthrough_reboot_window": _outside_now()})
    )
    before = [_tree(r) for r in roots]
    code = _provision(inv, tmp_path, "-e", "passthrough_batch=2")
    report = _report(capsys)
    assert code == 4
    assert [report[f"host-{i}"]["status"] for i in range(4)] == [
        "reboot pending",
        "not started",
        "failed",
        "not started",
    ]
    assert "reboot window: it is" in report["host-2"]["reason"]
    assert "stopped" in report["host-1"]["reason"]
    assert report["host-1"]["reboot_required"] is False
    assert _written(roots[0])
    for i in (1, 2, 3):
        assert _tree(roots[i]) == before[i], f"host-{i} was changed"
