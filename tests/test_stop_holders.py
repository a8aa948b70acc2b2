# SPDX-License-Identifier: Apache-2.0
"""``bind --stop-holders``: the units holding a card stopped around the binding, journaled,
and started again where a card is left for them (sample trees; systemctl printed there).

The live path runs against a fake ``systemctl`` on PATH — a mock, as named in each test that
uses it: no test may stop this machine's services. The binding itself is a stand-in there
(binding now needs the live kernel; tests/test_bind.py covers it under umockdev)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from passthrough.cli import main
from passthrough.errors import EXIT_HOST_STEP
from passthrough.host.discover import discover
from passthrough.host.holders import find_holders
from passthrough.host.root import HostRoot
from passthrough.live.bind import BindFailed
from passthrough.live.holders import (
    STOPPED,
    Systemctl,
    Unit,
    journaled,
    recover,
    stop_bind_start,
    units_to_stop,
)
from passthrough.model import Host

from .test_json_schemas import valid
from .test_preflight import CARD, _held

FUNCTIONS = [CARD, "0000:01:00.1"]


def _units_hold(hosts: dict[str, Path], tmp_path: Path) -> Path:
    """nvidia-persistenced holds /dev/nvidia0 and gdm holds the card's /dev/dri/card1; no
    process outside a unit holds it. The host keeps its Intel display (i915)."""
    root = _held(hosts, tmp_path)
    shutil.rmtree(root / "proc/4242")
    gdm = root / "proc/700"
    (gdm / "fd").mkdir(parents=True)
    (gdm / "comm").write_text("Xorg\n")
    (gdm / "cgroup").write_text("0::/system.slice/gdm.service\n")
    os.symlink("/dev/dri/card1", gdm / "fd/5")
    return root


def _files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


def test_not_on_the_live_host_the_commands_are_printed_in_order(
    hosts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _units_hold(hosts, tmp_path)
    before = _files(root)
    assert main(["bind", "--root", str(root), "--stop-holders"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        "systemctl stop gdm.service",
        "systemctl stop nvidia-persistenced.service",
        "systemctl start gdm.service",
        "# Started again: gdm.service (it held a display node, and 0000:00:02.0 is still the "
        "host's)",
        "# nvidia-persistenced.service not started again: its only reason was 0000:01:00.0, "
        "now on vfio (`systemctl start nvidia-persistenced.service` if it is still wanted)",
    ]
    assert "not the live host: the systemctl commands are printed, not run" in captured.err
    assert _files(root) == before  # no journal, nothing bound

    assert main(["bind", "--root", str(root), "--stop-holders", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["bound"] == []
    assert data["systemctl"] == [
        "systemctl stop gdm.service",
        "systemctl stop nvidia-persistenced.service",
        "systemctl start gdm.service",
    ]
    assert [n.split(" ", 1)[0] for n in data["not_started"]] == ["nvidia-persistenced.service"]
    assert valid(data) == "bind"


def test_a_holder_outside_any_unit_is_refused_by_name(
    hosts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _held(hosts, tmp_path)  # python3 (pid 4242) runs in a session scope
    before = _files(root)
    assert main(["bind", "--root", str(root), "--stop-holders", "--yes"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "passthrough: error: python3 (pid 4242) holds /dev/dri/renderD128: not in a system "
        "service, and --stop-holders stops only those (it never kills a process): end it, then "
        "bind\n"
    )
    assert _files(root) == before


def _fake_systemctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow: str = "") -> Path:
    """A mock ``systemctl`` first on PATH: it logs its arguments; ``slow`` (a "verb unit")
    hangs, as a stop that never finishes would."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "systemctl.log"
    script = bindir / "systemctl"
    script.write_text(
        f'#!/bin/sh\necho "$*" >> {log}\nif [ "$*" = "{slow}" ]; then exec sleep 30; fi\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return log


def _setup(root: Path) -> tuple[HostRoot, Host, list[Unit]]:
    r = HostRoot(str(root))
    host = discover(str(root))
    return r, host, units_to_stop(host, find_holders(r, FUNCTIONS))


def test_units_are_stopped_journaled_bound_and_started_again(
    hosts: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a mock systemctl (fake, on PATH): the order is stop, stop, bind, start; while
    the binding runs both units are in the journal; afterwards it is gone."""
    root = _units_hold(hosts, tmp_path / "t")
    log = _fake_systemctl(tmp_path, monkeypatch)
    r, host, units = _setup(root)
    seen_in_journal: list[str] = []

    def bind() -> list[str]:
        seen_in_journal.extend(u.name for u in journaled(r))
        with open(log, "a") as fh:
            fh.write("bind\n")
        return FUNCTIONS

    out = stop_bind_start(r, host, units, Systemctl(True, 5.0), bind, FUNCTIONS)
    assert log.read_text().splitlines() == [
        "stop gdm.service",
        "stop nvidia-persistenced.service",
        "bind",
        "start gdm.service",
    ]
    assert seen_in_journal == ["gdm.service", "nvidia-persistenced.service"]
    assert not (root / STOPPED).exists()
    assert out.bound == FUNCTIONS
    assert out.stopped == ["gdm.service", "nvidia-persistenced.service"]
    assert out.started == [
        "gdm.service (it held a display node, and 0000:00:02.0 is still the host's)"
    ]
    assert out.left[0].startswith("nvidia-persistenced.service not started again")


def test_a_stop_that_hangs_times_out_and_what_was_stopped_is_started_again(
    hosts: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a mock systemctl (fake, on PATH) whose second stop hangs: it is given up after
    the timeout, nothing is bound, and both units are started again (the card is still on
    nvidia, so nvidia-persistenced has its reason back)."""
    root = _units_hold(hosts, tmp_path / "t")
    log = _fake_systemctl(tmp_path, monkeypatch, slow="stop nvidia-persistenced.service")
    r, host, units = _setup(root)
    called: list[str] = []
    with pytest.raises(BindFailed) as info:
        stop_bind_start(
            r,
            host,
            units,
            Systemctl(True, 0.5),
            lambda: called or [],
            FUNCTIONS,
        )
    assert info.value.exit_code == EXIT_HOST_STEP
    assert str(info.value).startswith(
        "`systemctl stop nvidia-persistenced.service` did not finish within 0.5s; started "
        "again: gdm.service"
    )
    assert log.read_text().splitlines() == [
        "stop gdm.service",
        "stop nvidia-persistenced.service",
        "start gdm.service",
        "start nvidia-persistenced.service",
    ]
    assert called == []
    assert not (root / STOPPED).exists()


def test_a_bind_killed_between_stop_and_start_is_recovered_from_the_journal(
    hosts: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a mock systemctl (fake, on PATH): a process is SIGKILLed where the binding
    would run; the journal still names both units, and the next run starts them again."""
    root = _units_hold(hosts, tmp_path / "t")
    log = _fake_systemctl(tmp_path, monkeypatch)
    script = f"""
import os, signal
from passthrough.live.holders import Systemctl, stop_bind_start, units_to_stop
from passthrough.host.discover import discover
from passthrough.host.holders import find_holders
from passthrough.host.root import HostRoot
r = HostRoot({str(root)!r}); host = discover({str(root)!r})
units = units_to_stop(host, find_holders(r, {FUNCTIONS!r}))
stop_bind_start(r, host, units, Systemctl(True, 5.0),
                lambda: os.kill(os.getpid(), signal.SIGKILL), {FUNCTIONS!r})
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    r = subprocess.run([sys.executable, "-c", script], env=env, timeout=120, check=False)
    assert r.returncode == -9
    assert log.read_text().splitlines() == ["stop gdm.service", "stop nvidia-persistenced.service"]
    hr = HostRoot(str(root))
    assert [u.name for u in journaled(hr)] == ["gdm.service", "nvidia-persistenced.service"]

    out = recover(hr, discover(str(root)), Systemctl(True, 5.0))
    assert out is not None
    assert log.read_text().splitlines()[2:] == [
        "start gdm.service",
        "start nvidia-persistenced.service",  # nothing was bound: its card is still on nvidia
    ]
    assert out.started[1] == "nvidia-persistenced.service (0000:01:00.0 is still on nvidia)"
    assert not (root / STOPPED).exists()
    assert recover(hr, discover(str(root)), Systemctl(True, 5.0)) is None


def test_a_start_that_fails_is_reported_and_stays_journaled(
    hosts: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a mock systemctl (fake, on PATH) whose start of gdm fails: the binding stands,
    the failure is told with systemctl's own message, and gdm stays in the journal for the
    next run."""
    root = _units_hold(hosts, tmp_path / "t")
    log = _fake_systemctl(tmp_path, monkeypatch)
    script = tmp_path / "bin/systemctl"
    script.write_text(
        script.read_text()
        + 'if [ "$*" = "start gdm.service" ]; then echo "Job failed." >&2; exit 1; fi\n'
    )
    r, host, units = _setup(root)
    out = stop_bind_start(r, host, units, Systemctl(True, 5.0), lambda: FUNCTIONS, FUNCTIONS)
    assert out.bound == FUNCTIONS
    assert out.failed == ["`systemctl start gdm.service` failed with exit 1: Job failed."]
    assert out.started == []
    assert log.read_text().splitlines()[-1] == "start gdm.service"
    assert [u.name for u in journaled(r)] == ["gdm.service"]


def test_a_holder_in_a_users_session_is_not_a_unit_to_stop(
    hosts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CUDA job started from a desktop runs below the user's manager (user@1000.service):
    stopping that would end the session, so it is refused like a bare pid."""
    root = _units_hold(hosts, tmp_path)
    job = root / "proc/5150"
    (job / "fd").mkdir(parents=True)
    (job / "comm").write_text("python3\n")
    (job / "cgroup").write_text(
        "0::/user.slice/user-1000.slice/user@1000.service/app.slice/jupyter.service\n"
    )
    os.symlink("/dev/nvidia0", job / "fd/7")
    assert main(["bind", "--root", str(root), "--stop-holders"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "passthrough: error: python3 (pid 5150) holds /dev/nvidia0: not in a system service"
    ), err


CONTAINED = {
    "lxc": ("0::/lxc/101/ns/system.slice/ssh.service\n", "LXC container 101"),
    "lxc-payload": ("0::/lxc.payload.101/system.slice/ssh.service\n", "LXC container 101"),
    "nspawn": (
        "0::/machine.slice/systemd-nspawn@web.service/payload/system.slice/ssh.service\n",
        "systemd-nspawn container web",
    ),
    "machine-scope": (
        "0::/machine.slice/machine-web.scope/payload/system.slice/ssh.service\n",
        "machine web",
    ),
    "docker-scope": (
        "0::/system.slice/docker-" + "ab12" * 16 + ".scope\n",
        "Docker container ab12ab12ab12",
    ),
    "docker-v1": ("12:devices:/docker/" + "cd34" * 16 + "\n", "Docker container cd34cd34cd34"),
    "podman": (
        "0::/machine.slice/libpod-" + "ef56" * 16 + ".scope/container\n",
        "Podman container ef56ef56ef56",
    ),
}


@pytest.mark.parametrize("case", sorted(CONTAINED))
def test_a_holder_inside_a_container_is_refused_naming_it(
    case: str, hosts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 30: a holder in a Proxmox LXC or nspawn container named ``ssh.service`` in its
    cgroup made bind stop the *host's* ssh.service (and leave the holder running). A holder
    in any container is refused with the container named; nothing is stopped or printed."""
    cgroup, name = CONTAINED[case]
    root = _units_hold(hosts, tmp_path)
    job = root / "proc/5151"
    (job / "fd").mkdir(parents=True)
    (job / "comm").write_text("cuda-job\n")
    (job / "cgroup").write_text(cgroup)
    os.symlink("/dev/nvidia0", job / "fd/3")
    before = _files(root)
    assert main(["bind", "--root", str(root), "--stop-holders", "--yes"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"passthrough: error: cuda-job (pid 5151) holds /dev/nvidia0: runs inside {name}, and "
        "--stop-holders stops only the host's own system services: stop it inside the "
        "container, then bind\n"
    )
    assert _files(root) == before


@pytest.mark.parametrize(
    ("cgroup", "unit"),
    [
        # a libvirt QEMU guest's emulator runs on the host, in no container (and no unit)
        ("0::/machine.slice/machine-qemu\\x2d1\\x2dvm.scope/libvirt/emulator\n", None),
        ("0::/system.slice/nvidia-persistenced.service\n", "nvidia-persistenced.service"),
        ("0::/system.slice/system-getty.slice/getty@tty1.service\n", "getty@tty1.service"),
        ("0::/init.scope\n", None),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
        ("0::/some.slice/other.service\n", None),  # not the host's system.slice
    ],
)
def test_only_a_unit_of_the_hosts_system_slice_is_one(cgroup: str, unit: str | None) -> None:
    from passthrough.host.holders import _placement

    assert _placement(cgroup) == (unit, None)
