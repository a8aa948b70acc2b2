# SPDX-License-Identifier: Apache-2.0
"""What discovery reads besides the PCI tree: proc, kernel config and modules, IOMMU,
firmware, DMI, os-release, pci.ids, the root disk and the default route."""

from __future__ import annotations

import json

from passthrough.errors import BadDescription
from passthrough.fakehost.boot import boot_files
from passthrough.fakehost.description import Description, Node
from passthrough.fakehost.writer import Writer
from passthrough.host.pciids import render_subset
from passthrough.model import PciAddress

# A few real modules.alias lines (the kernel's and the NVIDIA driver's patterns) for
# the classes the sample hosts carry.
MODULES_ALIAS = """\
# Aliases extracted from modules themselves.
alias pci:v000010DEd*sv*sd*bc03sc00i00* nouveau
alias pci:v000012D2d*sv*sd*bc03sc*i* nouveau
alias pci:v000010DEd*sv*sd*bc03sc02i00* nouveau
alias pci:v000010DEd*sv*sd*bc03sc00i00* nvidia
alias pci:v000010DEd*sv*sd*bc03sc02i00* nvidia
alias pci:v000010DEd*sv*sd*bc06sc80i00* nvidia
alias pci:v000010DEd*sv*sd*bc04sc03i00* snd_hda_intel
alias pci:v00008086d00007AD0sv*sd*bc*sc*i* snd_hda_intel
alias pci:v00001002d*sv*sd*bc04sc03i00* snd_hda_intel
alias pci:v*d*sv*sd*bc0Csc03i30* xhci_pci
alias pci:v000010DEd*sv*sd*bc0Csc80i00* i2c_nvidia_gpu
alias pci:v00001002d00001638sv*sd*bc*sc*i* amdgpu
alias pci:v*d*sv*sd*bc01sc08i02* nvme
alias pci:v*d*sv*sd*bc01sc06i01* ahci
alias pci:v00001A03d00002000sv*sd*bc*sc*i* ast
alias pci:v000015B3d00001021sv*sd*bc*sc*i* mlx5_core
"""

CPU_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr "
    "sse sse2 ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology cpuid pni "
    "pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand"
)


def _vtd_cap(mgaw: int) -> int:
    """A VT-d capability register: a real client part's value with MGAW (bits 21:16, the
    width minus one) and SAGAW (bits 12:8: 39-bit 3-level, 48-bit 4-level, 57-bit 5-level
    tables) set for this width."""
    sagaw = 0x2 if mgaw <= 39 else 0x4 if mgaw <= 48 else 0x8
    base = 0xD2008C40660462 & ~(0x3F << 16) & ~(0x1F << 8)
    return base | ((mgaw - 1) << 16) | (sagaw << 8)


def write_host_files(desc: Description, w: Writer, by_addr: dict[PciAddress, Node]) -> None:
    _cpu_and_proc(desc, w)
    _kernel_files(desc, w)
    _iommu_files(desc, w)
    _firmware_files(desc, w)
    _names(desc, w)
    _storage_and_net(desc, w, by_addr)
    if desc.packages:
        _dpkg_status(desc.packages, w)


def _dpkg_status(packages: dict[str, str], w: Writer) -> None:
    """The installed packages as dpkg lists them, among others a real database holds (one
    unrelated, one removed with its configuration left)."""
    blocks = [
        "Package: bash\nStatus: install ok installed\nPriority: required\nVersion: 5.2.15-2+b7\n",
        "Package: ovmf-legacy\nStatus: deinstall ok config-files\nVersion: 2020.11-2\n",
    ]
    blocks += [
        f"Package: {name}\nStatus: install ok installed\nArchitecture: amd64\nVersion: {version}\n"
        for name, version in sorted(packages.items())
    ]
    w.file("var/lib/dpkg/status", "\n".join(blocks))


def _cpu_and_proc(desc: Description, w: Writer) -> None:
    """The CPUs, RAM, NUMA nodes, command line and interrupts under proc/ and sys/."""
    virt = ("vmx" if desc.cpu_vendor == "GenuineIntel" else "svm") if desc.cpu_virt else ""
    blocks = []
    for i in range(desc.cpus):
        blocks.append(
            f"processor\t: {i}\nvendor_id\t: {desc.cpu_vendor}\nmodel name\t: {desc.cpu_model}\n"
            f"flags\t\t: {CPU_FLAGS} {virt}\n"
            f"address sizes\t: {desc.phys_bits} bits physical, 48 bits virtual\n"
        )
    w.file("proc/cpuinfo", "\n".join(blocks) + "\n")
    w.file("proc/cmdline", desc.cmdline + "\n")
    w.file("proc/meminfo", f"MemTotal:       {desc.memory_gib << 20} kB\n")
    nodes = sorted({n.numa for n in desc.nodes if n.numa >= 0}) or [0]
    per = max(1, desc.cpus // len(nodes))
    for i, node in enumerate(nodes):
        first = i * per
        w.file(f"sys/devices/system/node/node{node}/cpulist", f"{first}-{first + per - 1}\n")
    w.file("proc/sys/kernel/osrelease", desc.release + "\n")
    ir = desc.firmware_iommu and desc.intremap  # IR stays on even when DMA remapping is off
    prefix = "IR-" if ir else ""
    w.file(
        "proc/interrupts",
        "            CPU0       CPU1\n"
        f"   0:         44          0  {prefix}IO-APIC    2-edge      timer\n"
        f"   9:          0          0  {prefix}IO-APIC    9-fasteoi   acpi\n"
        f" 120:          0          0  {prefix}PCI-MSI-0000:00:00.0   0-edge      aerdrv\n",
    )
    if desc.kvm:
        w.file("dev/kvm", "")


def _kernel_files(desc: Description, w: Writer) -> None:
    """The running kernel's config and module lists (where vfio-pci comes from)."""
    config = "\n".join(
        f"# {k} is not set" if v == "n" else f"{k}={v}" for k, v in sorted(desc.config.items())
    )
    w.file(f"boot/config-{desc.release}", config + "\n")
    moddir = f"lib/modules/{desc.release}"
    dep = "kernel/drivers/vfio/vfio.ko:\nkernel/drivers/vfio/vfio_iommu_type1.ko: kernel/drivers/vfio/vfio.ko\n"
    if desc.vfio == "module":
        dep += "kernel/drivers/vfio/pci/vfio-pci.ko: kernel/drivers/vfio/pci/vfio-pci-core.ko kernel/drivers/vfio/vfio.ko\n"
    w.file(f"{moddir}/modules.dep", dep)
    w.file(f"{moddir}/modules.alias", MODULES_ALIAS)
    w.file(
        f"{moddir}/modules.builtin",
        "kernel/drivers/vfio/pci/vfio-pci.ko\n" if desc.vfio == "builtin" else "",
    )


def _iommu_files(desc: Description, w: Writer) -> None:
    """The firmware's DMAR/IVRS table and the IOMMU units the kernel made of it."""
    intel = desc.cpu_vendor == "GenuineIntel"
    if desc.firmware_iommu:
        table = "DMAR" if intel else "IVRS"
        w.file(f"sys/firmware/acpi/tables/{table}", table.encode() + bytes(32), 0o400)
        if desc.iommu_enabled:
            unit = "dmar0" if intel else "ivhd0"
            w.link(f"sys/class/iommu/{unit}", f"sys/devices/virtual/iommu/{unit}")
            if intel:
                ecap = 0xF050DA | (0x8 if desc.intremap else 0)
                w.file(f"sys/devices/virtual/iommu/{unit}/intel-iommu/ecap", f"{ecap:x}\n")
                w.file(
                    f"sys/devices/virtual/iommu/{unit}/intel-iommu/cap",
                    f"{_vtd_cap(desc.iommu_bits):x}\n",
                )
            else:
                w.file(f"sys/devices/virtual/iommu/{unit}/amd-iommu/features", "25bf732fa2295afe\n")
    w.dir("sys/kernel/iommu_groups")
    _iommufd_files(desc, w)


def _iommufd_files(desc: Description, w: Writer) -> None:
    """/dev/iommu and the vfio device cdevs, numbered as the kernel does: in bind order."""
    if desc.dev_iommu:
        w.file("dev/iommu", "")
    if desc.iommufd_module:
        w.dir("sys/module/iommufd")
    bound = [n for n in desc.nodes if n.driver == "vfio-pci"]
    for index, n in enumerate(sorted(bound, key=lambda n: n.address)):
        if desc.vfio_dev:
            w.file(f"{n.path}/vfio-dev/vfio{index}/dev", f"511:{index}\n")
        if desc.vfio_dev_nodes:
            w.file(f"dev/vfio/devices/vfio{index}", "")


def _firmware_files(desc: Description, w: Writer) -> None:
    """UEFI, DMI, os-release and the boot tooling."""
    if desc.uefi:
        w.dir("sys/firmware/efi/efivars")
        if desc.bootloader.startswith("systemd-boot"):
            w.file(
                "sys/firmware/efi/efivars/LoaderInfo-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f",
                b"\x06\x00\x00\x00s\x00d\x00",
            )
    dmi = desc.dmi
    w.file("sys/class/dmi/id/chassis_type", f"{int(dmi.get('chassis_type', 3))}\n")
    w.file("sys/class/dmi/id/sys_vendor", f"{dmi.get('vendor', 'To Be Filled By O.E.M.')}\n")
    w.file("sys/class/dmi/id/product_name", f"{dmi.get('product', 'System Product Name')}\n")
    # Distro and boot tooling (markers: discovery only looks for their presence)
    w.file("usr/lib/os-release", "".join(f'{k}="{v}"\n' for k, v in desc.os_release.items()))
    w.link("etc/os-release", "usr/lib/os-release")
    boot_files(desc, w)
    _qemu_files(desc, w)


def _qemu_files(desc: Description, w: Writer) -> None:
    """QEMU where the distro installs it, and one firmware descriptor (Secure Boot with
    Microsoft keys) as QEMU's interop format has it (discovery reads them: host/qemu.py)."""
    family = {desc.os_release.get("ID", ""), *desc.os_release.get("ID_LIKE", "").split()}
    rhel = "rhel" in family  # RHEL, Rocky, Alma (Fedora ships qemu-system-x86_64)
    w.file("usr/libexec/qemu-kvm" if rhel else "usr/bin/qemu-system-x86_64", "")
    ovmf = "OVMF/OVMF_{}_4M.ms.fd" if "debian" in family else "edk2/ovmf/OVMF_{}.secboot.fd"
    descriptor = {
        "interface-types": ["uefi"],
        "mapping": {
            "device": "flash",
            "executable": {"filename": "/usr/share/" + ovmf.format("CODE"), "format": "raw"},
            "nvram-template": {"filename": "/usr/share/" + ovmf.format("VARS"), "format": "raw"},
        },
        "targets": [{"architecture": "x86_64", "machines": ["pc-q35-*"]}],
        "features": ["acpi-s3", "enrolled-keys", "requires-smm", "secure-boot"],
    }
    w.file("usr/share/qemu/firmware/40-edk2-x86_64-secure-enrolled.json", json.dumps(descriptor))


def _names(desc: Description, w: Writer) -> None:
    """pci.ids with the names the description gives (one name per id)."""
    names: dict[tuple[int, int | None], str] = {}
    for vendor, vname in desc.vendors.items():
        names[(vendor, None)] = vname
    for n in desc.nodes:
        if n.name:
            known = names.get((n.vendor, n.device))
            if known is not None and known != n.name:
                raise BadDescription(
                    desc.source,
                    f"{n.address}: {n.vendor:04x}:{n.device:04x} named both {known!r} and {n.name!r}",
                )
            names[(n.vendor, n.device)] = n.name
            names.setdefault((n.vendor, None), f"Vendor {n.vendor:04x}")
    w.file("usr/share/misc/pci.ids", render_subset(names))


def _storage_and_net(desc: Description, w: Writer, by_addr: dict[PciAddress, Node]) -> None:
    routes = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
    mount_src, devnum = "/dev/sda2", "8:2"
    if desc.root_disk:
        spec = desc.root_disk
        ctrl = by_addr.get(PciAddress.parse(str(spec["pci"])))
        if ctrl is None:
            raise BadDescription(desc.source, f"root_disk: {spec['pci']} is not described")
        if spec.get("kind", "nvme") == "nvme":
            disk_path = f"{ctrl.path}/nvme/nvme0/nvme0n1"
            disk, part, major, base_minor = "nvme0n1", "nvme0n1p2", 259, 0
        else:
            disk_path = f"{ctrl.path}/ata1/host0/target0:0:0/0:0:0:0/block/sda"
            disk, part, major, base_minor = "sda", "sda2", 8, 0
        w.file(f"{disk_path}/dev", f"{major}:{base_minor}\n")
        w.file(f"{disk_path}/{part}/dev", f"{major}:{base_minor + 2}\n")
        w.file(f"{disk_path}/{part}/partition", "2\n")
        w.link(f"sys/class/block/{disk}", disk_path)
        w.link(f"sys/class/block/{part}", f"{disk_path}/{part}")
        w.link(f"sys/dev/block/{major}:{base_minor}", disk_path)
        w.link(f"sys/dev/block/{major}:{base_minor + 2}", f"{disk_path}/{part}")
        mount_src, devnum = f"/dev/{part}", f"{major}:{base_minor + 2}"
        if spec.get("lvm"):
            dm = "sys/devices/virtual/block/dm-0"
            w.file(f"{dm}/dev", "253:0\n")
            w.link(f"{dm}/slaves/{part}", f"{disk_path}/{part}")
            w.link("sys/class/block/dm-0", dm)
            w.link("sys/dev/block/253:0", dm)
            mount_src, devnum = "/dev/mapper/vg0-root", "253:0"
    w.file(
        "proc/self/mountinfo",
        f"26 1 {devnum} / / rw,relatime shared:1 - ext4 {mount_src} rw,errors=remount-ro\n"
        "22 26 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n"
        "23 26 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw\n",
    )
    if desc.nic:
        spec = desc.nic
        ctrl = by_addr.get(PciAddress.parse(str(spec["pci"])))
        if ctrl is None:
            raise BadDescription(desc.source, f"nic: {spec['pci']} is not described")
        iface = str(spec.get("iface", "eno1"))
        netdir = f"{ctrl.path}/net/{iface}"
        w.file(f"{netdir}/address", "3c:ec:ef:10:20:30\n")
        w.link(f"{netdir}/device", ctrl.path)
        w.link(f"sys/class/net/{iface}", netdir)
        route_if = iface
        if spec.get("bridge"):
            br = str(spec["bridge"])
            brdir = f"sys/devices/virtual/net/{br}"
            w.file(f"{brdir}/address", "3c:ec:ef:10:20:30\n")
            w.link(f"{brdir}/brif/{iface}", f"{netdir}/brport")
            w.dir(f"{netdir}/brport")
            w.link(f"sys/class/net/{br}", brdir)
            route_if = br
        routes += f"{route_if}\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
        routes += f"{route_if}\t0001A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
    w.file("proc/net/route", routes)
