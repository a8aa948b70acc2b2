# SPDX-License-Identifier: Apache-2.0
"""The firmware half of the nested guest, without the lab host: the lab image's kernel and
the nested guest's busybox initramfs boot through this machine's OVMF under QEMU with the
large-BAR stand-in (ivshmem-plain, a 64 GiB BAR on a sparse file) — once with the layout
the address planner decides for it, once without. Seconds, not minutes; the full lab
(test_lab.py) does the same through vfio inside the lab host."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from passthrough.model import Bar, PciAddress, PciFunction
from passthrough.units import GIB
from passthrough.vm.layout import plan_layout
from passthrough.vm.versions import DEFAULT_VERSIONS

REPO = Path(__file__).parents[2]
sys.path.insert(0, str(REPO / "lab"))
import image  # noqa: E402
import nested  # noqa: E402

pytestmark = pytest.mark.lab
BIG = 64 * GIB
OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")

# what the lab host's sysfs shows for the stand-in (lab/machine.py big_bar)
STAND_IN = PciFunction(
    address=PciAddress(0, 3, 0, 0),
    vendor_id=0x1AF4,
    device_id=0x1110,
    subsystem_vendor_id=None,
    subsystem_device_id=None,
    class_code=0x050000,
    driver=None,
    iommu_group=None,
    numa_node=None,
    boot_vga=None,
    reset_methods=None,
    bars=(Bar(0, 256, False, False, False), Bar(2, BIG, False, True, True)),
    parents=(),
    physfn=None,
    sriov_totalvfs=None,
    modalias=None,
    sysfs_path="",
)


def _boot(tmp: Path, tag: str, bits: int, window_mib: int | None) -> nested.Capture:
    tree = image.tree()
    kernel = sorted(tree.glob("boot/vmlinuz-*"))[-1]
    initrd = tmp / "initrd.gz"
    if not initrd.exists():
        initrd.write_bytes(nested.initramfs((tree / "bin/busybox").read_bytes()))
    serial = tmp / f"serial-{tag}.log"
    vars_copy = tmp / f"vars-{tag}.fd"
    shutil.copy(OVMF_CODE.with_name("OVMF_VARS_4M.fd"), vars_copy)
    # what libvirt makes of <maxphysaddr mode='emulate'>, the fw_cfg entry and <pcihole64>
    window = []
    if window_mib:
        window = [
            "-fw_cfg",
            f"name=opt/ovmf/X-PciMmio64Mb,string={window_mib}",
            "-global",
            f"q35-pcihost.pci-hole64-size={window_mib}M",
        ]
    argv = [
        "qemu-system-x86_64",
        "-accel",
        "tcg",
        "-M",
        "q35",
        "-cpu",
        f"max,phys-bits={bits}",
        "-m",
        "256",
        "-drive",
        f"if=pflash,format=raw,readonly=on,file={OVMF_CODE}",
        "-drive",
        f"if=pflash,format=raw,file={vars_copy}",
        "-kernel",
        str(kernel),
        "-initrd",
        str(initrd),
        "-append",
        "console=ttyS0 panic=-1 quiet loglevel=4",
        "-object",
        f"memory-backend-file,id=big,size={BIG >> 30}G,mem-path={tmp / 'big.mem'},share=on",
        "-device",
        "pcie-root-port,id=rp1,chassis=1,slot=1,bus=pcie.0,addr=0x5",
        "-device",
        "ivshmem-plain,memdev=big,bus=rp1",
        # a device of the domain's own behind its root port, as libvirt adds them: its
        # virtio BAR (64-bit prefetchable) takes a share of the same 64-bit window
        "-device",
        "pcie-root-port,id=rp2,chassis=2,slot=2,bus=pcie.0,addr=0x6",
        "-device",
        "virtio-serial-pci,bus=rp2",
        *window,
        "-display",
        "none",
        "-monitor",
        "none",
        "-serial",
        f"file:{serial}",
        "-no-reboot",
    ]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    return nested.parse_capture(serial.read_text(errors="replace"))


def test_the_planned_window_holds_a_64_gib_bar_an_exact_fit_and_the_fallback_do_not(
    tmp_path: Path,
) -> None:
    assert shutil.which("qemu-system-x86_64") and OVMF_CODE.exists()
    # the lab host as the planner sees it: TCG's "max" CPU (AuthenticAMD, 40 bits) behind
    # QEMU's intel-iommu (39-bit MGAW), a TCG guest of 256 MiB
    layout = plan_layout(
        [[STAND_IN]],
        host_bits=40,
        iommu_bits=39,
        cpu_vendor="AuthenticAMD",
        memory_mib=256,
        versions=DEFAULT_VERSIONS,
        virt_type="qemu",
    )
    assert layout.guest_bits == 39 and layout.fwcfg_mib == 128 * 1024
    planned = _boot(tmp_path, "planned", layout.guest_bits, layout.fwcfg_mib)
    start, size = planned.functions["0000:01:00.0"].bar(2) or (0, 0)
    assert size == BIG
    assert layout.window.base <= start and start + size <= layout.window.end
    # a window of exactly the BAR's size (what the planner gave before the lab showed it)
    # leaves no room for the virtio device's share: OVMF drops the large BAR
    exact = _boot(tmp_path, "exact", layout.guest_bits, BIG >> 20)
    assert exact.functions["0000:01:00.0"].bar(2) is None
    assert nested.no_space(exact, "0000:01:00.0")
    # without the planner: bits OVMF does not trust and no window entry — its 32 GiB
    # fallback cannot hold the BAR, and the guest's kernel says so
    broken = _boot(tmp_path, "broken", 38, None)
    assert broken.functions["0000:01:00.0"].bar(2) is None
    assert nested.no_space(broken, "0000:01:00.0")
