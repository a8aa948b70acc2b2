# SPDX-License-Identifier: Apache-2.0
"""Binding now, under umockdev: real pyudev events from a UMockdev test bed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from passthrough import fakehost

WRAPPER = shutil.which("umockdev-wrapper")
PROBE = Path(__file__).with_name("umockdev_bind_probe.py")
pytestmark = pytest.mark.umockdev


def _run(
    hosts: dict[str, Path], tmp_path: Path, mode: str, sample: str = "consumer-intel"
) -> dict[str, object]:
    """The probe under umockdev-wrapper on ``sample``'s record; release modes get a state
    directory of their own for the live-driver journal."""
    assert WRAPPER, "umockdev-wrapper is required (apt-get install umockdev); .ci/run installs it"
    record = tmp_path / "host.umockdev"
    record.write_text(fakehost.umockdev_record(fakehost.load(sample), hosts[sample]))
    state = tmp_path / "state"
    state.mkdir()
    r = subprocess.run(
        [WRAPPER, sys.executable, str(PROBE), str(record), mode, str(state)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=Path(__file__).parents[1],
    )
    assert r.returncode == 0, r.stderr
    data: dict[str, object] = json.loads(r.stdout.strip().splitlines()[-1])
    return data


def test_bind_moves_both_functions_to_vfio_on_bind_events(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    data = _run(hosts, tmp_path, "ok")
    assert "error" not in data, data
    assert data["bound"] == ["0000:01:00.0", "0000:01:00.1"]
    assert data["drivers"] == {"0000:01:00.0": "vfio-pci", "0000:01:00.1": "vfio-pci"}
    assert data["kernel_saw"] == [
        "unbind 0000:01:00.0",
        "probe 0000:01:00.0 override=vfio-pci",
        "unbind 0000:01:00.1",
        "probe 0000:01:00.1 override=vfio-pci",
    ]


def test_bind_refuses_a_gpu_whose_driver_is_in_use(hosts: dict[str, Path], tmp_path: Path) -> None:
    data = _run(hosts, tmp_path, "in-use")
    assert str(data["error"]).startswith(
        "BindRefused: 0000:01:00.0: not bound now: its driver nvidia is in use"
    )
    assert data["kernel_saw"] == []  # nothing was written


def test_bind_without_a_bind_event_fails_after_the_timeout(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    data = _run(hosts, tmp_path, "no-bind")
    assert str(data["error"]).startswith("BindFailed: no bind event for 0000:01:00.0 within 2s")
    assert data["kernel_saw"] == ["unbind 0000:01:00.0", "probe 0000:01:00.0 override=vfio-pci"]


def test_bind_moves_a_card_to_its_variant_driver_and_its_audio_to_vfio_pci(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    data = _run(hosts, tmp_path, "variant")
    assert "error" not in data, data
    assert data["drivers"] == {"0000:01:00.0": "my_variant_vfio_pci", "0000:01:00.1": "vfio-pci"}
    assert data["kernel_saw"] == [
        "unbind 0000:01:00.0",
        "probe 0000:01:00.0 override=my_variant_vfio_pci",
        "unbind 0000:01:00.1",
        "probe 0000:01:00.1 override=vfio-pci",
    ]


def test_bind_refuses_when_the_variant_driver_is_not_loaded(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    data = _run(hosts, tmp_path, "variant-unloaded")
    assert data["error"] == (
        "BindRefused: my_variant_vfio_pci is not loaded: run `modprobe my_variant_vfio_pci` first"
    )
    assert data["kernel_saw"] == []  # nothing was written


# -- release: the card on vfio-pci given back, under the same stand-in kernel ---------------


def _release(hosts: dict[str, Path], tmp_path: Path, mode: str) -> dict[str, object]:
    return _run(hosts, tmp_path, mode, "acs-override-proxmox")  # its card is on vfio-pci


def test_release_gives_each_function_to_its_default_driver_and_bind_takes_it_back(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    data = _release(hosts, tmp_path, "release")
    assert "error" not in data, data
    assert data["released"] == {"0000:24:00.0": "nvidia", "0000:24:00.1": "snd_hda_intel"}
    assert data["drivers"] == {"0000:24:00.0": "nvidia", "0000:24:00.1": "snd_hda_intel"}
    assert data["bound"] == ["0000:24:00.0", "0000:24:00.1"]
    assert data["drivers_after_bind"] == {"0000:24:00.0": "vfio-pci", "0000:24:00.1": "vfio-pci"}
    # one function at a time, each unbound, its override cleared, probed, then bind's moves
    assert data["kernel_saw"] == [
        "unbind 0000:24:00.0",
        "probe 0000:24:00.0 override=",
        "unbind 0000:24:00.1",
        "probe 0000:24:00.1 override=",
        "unbind 0000:24:00.0",
        "probe 0000:24:00.0 override=vfio-pci",
        "unbind 0000:24:00.1",
        "probe 0000:24:00.1 override=vfio-pci",
    ]
    journal = data["journal"]
    assert isinstance(journal, dict)
    # bind noted the drivers it took them from: the next release goes back to them by name
    assert {a: (e["host_driver"], e["where"], e["moving"]) for a, e in journal.items()} == {
        "0000:24:00.0": ("nvidia", "vfio", None),
        "0000:24:00.1": ("snd_hda_intel", "vfio", None),
    }


def test_release_binds_by_name_the_driver_the_journal_remembers(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    data = _release(hosts, tmp_path, "release-journal")
    assert "error" not in data, data
    assert data["released"] == {"0000:24:00.0": "nouveau", "0000:24:00.1": "snd_hda_intel"}
    assert data["kernel_saw"][:2] == ["unbind 0000:24:00.0", "bind 0000:24:00.0 to nouveau"]


def test_release_without_a_bind_event_fails_naming_the_function(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    data = _release(hosts, tmp_path, "release-no-bind")
    assert str(data["error"]).startswith(
        "BindFailed: no bind event for 0000:24:00.0 within 2s: no host driver took it"
    )
    journal = data["journal"]
    assert isinstance(journal, dict)
    # the journal says where the cut-short move was going
    assert journal["0000:24:00.0"]["moving"] == "to-host"
    assert "0000:24:00.1" not in journal  # never started
