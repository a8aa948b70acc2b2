# SPDX-License-Identifier: Apache-2.0
"""pyudev against recorded devices (umockdev-run) agrees with the root-directory reader.

umockdev is real: its preload library gives libudev (and every open/readlink of /sys) a
test bed built from the record, so pyudev enumerates devices exactly as on a live host.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from passthrough import fakehost
from passthrough.analysis.scan import analyse
from passthrough.host.discover import discover
from passthrough.output.json import scan_json

UMOCKDEV_RUN = shutil.which("umockdev-run")
pytestmark = pytest.mark.umockdev

PROBE = """
import json, sys
from passthrough.host.discover import discover
from passthrough.host.udev import udev_pci_source
from passthrough.analysis.scan import analyse
from passthrough.output.json import scan_json
data = scan_json(analyse(discover(sys.argv[1], pci_source=udev_pci_source)))
print(json.dumps(data))
"""


def _under_umockdev(record: Path, root: Path) -> dict[str, object]:
    assert UMOCKDEV_RUN, "umockdev-run is required (apt-get install umockdev); .ci/run installs it"
    r = subprocess.run(
        [UMOCKDEV_RUN, "-d", str(record), "--", sys.executable, "-c", PROBE, str(root)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    data: dict[str, object] = json.loads(r.stdout)
    return data


@pytest.mark.parametrize(
    "name", ["consumer-intel", "amd-b550-chipset", "hgx-h100", "two-gpus-one-group"]
)
def test_udev_and_root_reader_give_the_same_report(
    name: str, hosts: dict[str, Path], tmp_path: Path
) -> None:
    desc = fakehost.load(name)
    record = tmp_path / f"{name}.umockdev"
    record.write_text(fakehost.umockdev_record(desc, hosts[name]))
    via_udev = _under_umockdev(record, hosts[name])
    via_root = scan_json(analyse(discover(str(hosts[name]))))
    assert via_udev == via_root
    assert via_udev["gpus"], "the comparison must cover GPUs"


def test_udev_names_come_from_the_hwdb_properties(hosts: dict[str, Path], tmp_path: Path) -> None:
    """Names in the record (ID_MODEL_FROM_DATABASE) win over the root's pci.ids."""
    root = tmp_path / "root"
    shutil.copytree(hosts["consumer-intel"], root, symlinks=True)
    (root / "usr/share/misc/pci.ids").write_text("# empty database\n")
    record = tmp_path / "r.umockdev"
    record.write_text(
        fakehost.umockdev_record(fakehost.load("consumer-intel"), hosts["consumer-intel"])
    )
    data = _under_umockdev(record, root)
    gpus = {g["address"]: g for g in data["gpus"]}  # type: ignore[union-attr]
    assert gpus["0000:01:00.0"]["name"] == "NVIDIA Corporation AD102 [GeForce RTX 4090]"
    plain = scan_json(analyse(discover(str(root))))
    assert {g["address"]: g for g in plain["gpus"]}["0000:01:00.0"][
        "name"
    ] == "vendor 10de device 2684"
