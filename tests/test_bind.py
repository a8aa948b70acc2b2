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


def _run(hosts: dict[str, Path], tmp_path: Path, mode: str) -> dict[str, object]:
    assert WRAPPER, "umockdev-wrapper is required (apt-get install umockdev); .ci/run installs it"
    record = tmp_path / "host.umockdev"
    record.write_text(
        fakehost.umockdev_record(fakehost.load("consumer-intel"), hosts["consumer-intel"])
    )
    r = subprocess.run(
        [WRAPPER, sys.executable, str(PROBE), str(record), mode],
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
