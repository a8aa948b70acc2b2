# SPDX-License-Identifier: Apache-2.0
"""host.yml rolls out: a canary, then batches, stopping at the first batch with a failed host.

Real ansible-playbook (through ansible-runner and ``passthrough provision``) over sample host
roots reached with the local connection, as tests/test_ansible.py runs them. A host's GRUB
setup is refused with a grub.d file that resets the command line after ours (the tool exits 2
on it); every host the stop leaves waiting is compared byte for byte with its tree before."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from passthrough.cli import main
from passthrough.provision.runner import run, summary_table
from tests.test_ansible import _inventory, _root

pytestmark = pytest.mark.fleet

RESET = 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n'  # sorts after 99-passthrough.cfg: refused


def _tree(root: Path) -> dict[str, bytes]:
    """Every file and link under ``root``: what a host that was left alone still has."""
    seen: dict[str, bytes] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            rel = str(path.relative_to(root))
            if path.is_symlink():
                seen[rel] = b"-> " + os.readlink(path).encode()
            elif path.is_file():
                seen[rel] = path.read_bytes()
    return seen


def _fleet(tmp_path: Path, count: int, refused: set[int]) -> tuple[Path, list[Path]]:
    """``count`` consumer-intel hosts, in order; those in ``refused`` carry the reset file."""
    roots = []
    hosts: dict[str, dict[str, Any]] = {}
    for i in range(count):
        root = _root(tmp_path, f"r{i}", "consumer-intel")
        if i in refused:
            (root / "etc/default/grub.d").mkdir(parents=True, exist_ok=True)
            (root / "etc/default/grub.d/zz-vendor.cfg").write_text(RESET)
        roots.append(root)
        hosts[f"host-{i}"] = {"passthrough_root": str(root)}
    return _inventory(tmp_path, hosts), roots


def test_a_failing_canary_leaves_every_other_host_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first host's GRUB setup is refused: the run fails naming it with the tool's reason
    and exit code, and no other host is started (each tree byte-identical)."""
    inv, roots = _fleet(tmp_path, 4, refused={0})
    before = [_tree(r) for r in roots]
    log = ["--log", str(tmp_path / "l.log")]
    assert main(["provision", "-i", str(inv), "--playbook", "host.yml", *log]) == 4
    out, err = capsys.readouterr()
    assert "canary: host-0 (3 waiting)" in err
    assert "  host-0: failed: " in err and "batch 2" not in err
    row = next(line for line in out.splitlines() if line.startswith("host-0"))
    assert row.split()[1] == "failed" and "sorts after 99-passthrough.cfg" in row
    assert row.endswith("(exit 2)"), row
    for i in (1, 2, 3):
        assert f"host-{i}  not started" in out
        assert _tree(roots[i]) == before[i], f"host-{i} was changed"
    assert err.strip().splitlines()[-1] == (
        "passthrough: error: host-0 failed (status failed, rc 2); "
        "3 host(s) not started (the rolling play stopped); see the log"
    )


def test_a_failure_in_batch_two_stops_before_batch_three_and_a_resume_finishes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Batches of two (-e passthrough_batch=2): [0] [1 2] [3 4] [5]; host 2 is refused, so
    1 (its batch) is done, 3.. are untouched. Fixed and run again, the rest is done and the
    hosts done before are not touched again (changed 0, trees byte-identical)."""
    inv, roots = _fleet(tmp_path, 6, refused={2})
    before = [_tree(r) for r in roots]
    argv = ["provision", "-i", str(inv), "--playbook", "host.yml", "--json"]
    argv += ["-e", "passthrough_batch=2", "--log", str(tmp_path / "l.log")]
    assert main(argv) == 4
    report = json.loads(capsys.readouterr().out)["hosts"]
    assert [report[f"host-{i}"]["status"] for i in range(6)] == [
        *("reboot pending", "reboot pending", "failed"),
        *("not started", "not started", "not started"),
    ]
    assert [report[f"host-{i}"]["batch"] for i in range(6)] == [1, 2, 2, None, None, None]
    assert "(exit 2)" in report["host-2"]["reason"]
    for i in (3, 4, 5):
        assert _tree(roots[i]) == before[i], f"host-{i} was changed"
    done = [_tree(r) for r in roots[:2]]
    (roots[2] / "etc/default/grub.d/zz-vendor.cfg").unlink()  # the fix
    again = run(str(inv), "host.yml", extravars={"passthrough_batch": 2})
    assert again.ok, summary_table(again)
    assert [again.hosts[f"host-{i}"].changed for i in range(2)] == [0, 0]
    assert all(again.hosts[f"host-{i}"].changed >= 1 for i in range(2, 6))
    assert [_tree(r) for r in roots[:2]] == done
    for root in roots[2:]:
        assert "vfio-pci.ids=" in (root / "etc/default/grub.d/99-passthrough.cfg").read_text()


def test_a_failure_limit_the_user_raises_lets_the_later_batches_go_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """passthrough_max_fail_percentage=50 with batches of two, [0] [1 2] [3]: host 1 fails,
    half its batch, which the limit allows, so batch 3 runs (the behaviour before rolling,
    now an explicit choice). A batch whose every host fails stops whatever the limit. The
    progress shows each batch and each host's outcome; the summary is a table in batch order."""
    inv, roots = _fleet(tmp_path, 4, refused={1})
    argv = ["provision", "-i", str(inv), "--playbook", "host.yml", "--log", str(tmp_path / "l")]
    argv += ["-e", "passthrough_max_fail_percentage=50", "-e", "passthrough_batch=2"]
    assert main(argv) == 4
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith(("canary", "batch", "  host"))]
    done = "applied: reboot pending, not verified"
    assert lines[0] == "canary: host-0 (3 waiting)" and lines[1] == f"  host-0: {done}"
    assert lines[2] == "batch 2: host-1, host-2 (1 waiting)"
    assert lines[3].startswith("  host-1: failed: ") and lines[3].endswith("(exit 2)")
    assert lines[4:] == [f"  host-2: {done}", "batch 3: host-3 (0 waiting)", f"  host-3: {done}"]
    table = [line.split("  ") for line in out.splitlines()[:5]]
    table = [[c.strip() for c in row if c.strip()] for row in table]
    assert [row[:2] + row[6:8] for row in table] == [
        ["host", "status", "reboot", "batch"],
        ["host-0", "reboot pending", "required", "1"],
        ["host-1", "failed", "-", "2"],
        ["host-2", "reboot pending", "required", "2"],
        ["host-3", "reboot pending", "required", "3"],
    ]
    assert (roots[3] / "etc/default/grub.d/99-passthrough.cfg").exists()
