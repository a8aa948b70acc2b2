# SPDX-License-Identifier: Apache-2.0
"""The rolling host play over real SSH connections: each host a network namespace with its own
address and its own ``sshd`` (benchmarks/sshfleet.py, the machinery the fleet benchmark and
tests/test_hosttask.py use), so every task pays a real login, key exchange and ControlPersist.

tests/test_fleet_rolling.py, test_fleet_settings.py and test_fleet_guests.py prove each case
over the local connection; here the same plays go over SSH, together: group_vars' canary and
batch, a host failing mid-batch (its batch mates "not started"), reboot windows that cross
midnight (one inside, one outside), and ``passthrough_guests: skip`` with a running guest on
libvirt's test driver. Each host's summary row is judged against the files on its root.

The namespaces, links and daemons are named ``fos*`` on 10.233.0.0/16 (not the benchmark's
``ptb*``) and removed on the way out."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import libvirt
import pytest
import yaml

from passthrough.cli import main
from passthrough.provision.runner import run
from tests.test_ansible import _inventory, _root
from tests.test_fleet_guests import guest as guest  # the running gpu-guest fixture
from tests.test_fleet_guests import judge_skip, skip_fleet
from tests.test_fleet_rolling import _tree

pytestmark = [pytest.mark.fleet, pytest.mark.root, pytest.mark.slow]

REPO = Path(__file__).parents[1]
PREFIX, NET = "fos", "10.233"


@pytest.fixture
def ssh(tmp_path: Path) -> Iterator[Any]:
    """A function giving host ``i``'s connection variables (SSH to its own namespace)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import sshfleet

    assert sshfleet.missing() is None, sshfleet.missing()  # setup.sh test installs sshd
    with sshfleet.hosts(5, tmp_path / "ssh", prefix=PREFIX, net=NET) as client:

        def reach(i: int) -> dict[str, str]:
            return {**client, "ansible_connection": "ssh", "ansible_host": sshfleet.address(i, NET)}

        yield reach


def _zone_at(hour: int) -> str:
    """A fixed-offset zone (``Etc/GMT-N`` is UTC+N) where the hour now is ``hour``."""
    offset = (hour - datetime.now(UTC).hour) % 24
    offset = offset - 24 if offset > 14 else offset
    return f"Etc/GMT{-offset:+d}"


def _written(root: Path) -> str:
    path = root / "etc/default/grub.d/99-passthrough.cfg"
    return path.read_text() if path.exists() else ""


def test_over_ssh_group_vars_batches_a_failure_mid_batch_and_windows_across_midnight(
    tmp_path: Path, ssh: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Five hosts over SSH, reboots allowed; group_vars: a canary of 2, batches of 2, and a
    window across midnight that holds now (20:00-8:00 where it is 2 o'clock). host-3's own
    window, 23:59-1:00 where it is 19 o'clock, also crosses midnight and does not hold now:
    [0 1] [2 3] [4] — the canary is applied, host-3 is refused, host-2 (planned beside it,
    never applied) and host-4 are not started, and their roots are byte-identical."""
    roots = [_root(tmp_path, f"r{i}", "consumer-intel") for i in range(5)]
    inv = _inventory(
        tmp_path,
        {
            f"host-{i}": {"passthrough_root": str(r), "passthrough_reboot_ok": True, **ssh(i)}
            for i, r in enumerate(roots)
        },
    )
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars/gpu_hosts.yml").write_text(
        yaml.safe_dump(
            {
                "passthrough_canary": 2,
                "passthrough_batch": 2,
                "passthrough_reboot_window": f"20:00-8:00 {_zone_at(2)}",
            }
        )
    )
    outside = f"23:59-1:00 {_zone_at(19)}"
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars/host-3.yml").write_text(
        yaml.safe_dump({"passthrough_reboot_window": outside})
    )
    before = [_tree(r) for r in roots]
    argv = ["provision", "-i", str(inv), "--playbook", "host.yml", "--json"]
    code = main([*argv, "--log", str(tmp_path / "run.log")])
    hosts = json.loads(capsys.readouterr().out)["hosts"]
    assert code == 4, hosts
    assert [hosts[f"host-{i}"]["status"] for i in range(5)] == [
        *("reboot pending", "reboot pending"),
        *("not started", "failed", "not started"),
    ], hosts
    assert [hosts[f"host-{i}"]["batch"] for i in range(5)] == [1, 1, 2, 2, None], hosts
    assert "reboot window: it is" in hosts["host-3"]["reason"], hosts
    assert outside in hosts["host-3"]["reason"], hosts
    assert "stopped" in hosts["host-2"]["reason"], hosts
    assert hosts["host-2"]["reboot_required"] is False
    # judged against each host's root: the summary's "reboot pending" is a written change
    for i in (0, 1):
        assert "vfio-pci.ids=" in _written(roots[i]), f"host-{i}"
    for i in (2, 3, 4):
        assert _tree(roots[i]) == before[i], f"host-{i} was changed"


def test_over_ssh_skip_leaves_the_guest_host_and_the_rollout_goes_on(
    tmp_path: Path, ssh: Any, guest: libvirt.virDomain
) -> None:
    """passthrough_guests=skip over SSH: the canary's card is held by the running gpu-guest
    (libvirt's test driver, reached from the host's namespace through the daemon's socket),
    so that host is left as it was and reported skipped naming the guest; the next batch's
    host (another card) is done; the guest was never stopped."""
    inv, first, second = skip_fleet(tmp_path, ssh)
    before = _tree(first)
    judge_skip(run(str(inv), "host.yml"), guest, first, before, second)
