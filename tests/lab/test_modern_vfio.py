# SPDX-License-Identifier: Apache-2.0
"""The modern vfio stack on a real current kernel (lab/modern.py): iommufd's /dev/iommu and
the vfio device cdev under QEMU's emulated Intel IOMMU; `check`, `bind`, `release` and
`bind` again, each read back from sysfs inside the lab machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from .script import TOOLS, run_lab_script

CARD = ["0000:01:00.0", "0000:01:00.1"]
pytestmark = [pytest.mark.lab, pytest.mark.modernvfio]


def test_iommufd_and_vfio_cdev_on_a_current_kernel(tmp_path: Path) -> None:
    result = run_lab_script(
        tmp_path, "modern.py", [], [*TOOLS, "dpkg-deb", "depmod"], 3600, "modern"
    )
    # a kernel with iommufd: Ubuntu 24.04's newest generic (no Debian kernel has it)
    major, minor = (int(x) for x in result["kernel"].split(".")[:2])
    assert (major, minor) >= (6, 6) and result["kernel"].endswith("-generic")
    # before any vfio module: the check says what to load
    before = result["before_modprobe"]
    assert before["level"] == "WARN" and "iommufd module is not loaded" in before["summary"]
    assert "modprobe iommufd" in before["fix"]
    # modprobe vfio-pci brought iommufd with it; each function has its own cdev node
    bound = result["bind"]
    assert {"iommufd", "vfio", "vfio_pci"} <= set(bound["loaded"])
    assert set(bound["drivers"][a] for a in CARD) == {"vfio-pci"}
    nodes = bound["cdevs"]
    assert sorted(nodes) == CARD and len(set(nodes.values())) == 2
    assert all(n.startswith("/dev/vfio/devices/vfio") for n in nodes.values())
    # the check names /dev/iommu and each node; the lab host's own QEMU 7.2 and libvirt 9.0
    # (Debian 12's) are what keeps it from PASS, and the check says so
    iommufd = result["iommufd"]
    for a, n in nodes.items():
        assert f"{a} → {n}" in iommufd["summary"]
    assert iommufd["level"] == "INFO" and "QEMU 7.2 predates iommufd" in iommufd["summary"]
    assert "libvirt 9.0 predates iommufd" in iommufd["summary"]
    # release: each function back to the driver it had before bind, as sysfs says
    released = result["release"]
    assert released["drivers"] == bound["before"] == released["released"]
    assert "vfio-pci" not in released["drivers"].values() and all(released["drivers"].values())
    # bind again: vfio-pci and a cdev for each function
    again = result["rebind"]
    assert set(again["drivers"].values()) == {"vfio-pci"} and sorted(again["cdevs"]) == CARD
    assert set(result["timings"]) == {
        "image",
        "boot",
        "check",
        "bind",
        "ready",
        "release",
        "rebind",
    }
