# SPDX-License-Identifier: Apache-2.0
"""The nested guest that boots: a real kernel through OVMF with a busybox initramfs whose
``init`` prints the guest's own view of its PCI functions (sysfs ``resource`` lines,
vendor/device/class) and the kernel's BAR messages to the serial port, then powers off.

The lab host writes the initramfs with this file (``python3 nested.py BUSYBOX OUTPUT``); the
lab edits the domain XML the library rendered (direct kernel boot, the serial port into a
file) and reads the capture back with ``parse_capture``.
"""

from __future__ import annotations

import gzip
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
BEGIN, END = "@@capture-begin", "@@capture-end"


def dump(devices: str) -> str:
    """Shell printing each PCI function's IDs and sysfs ``resource`` lines as ``@@`` lines:
    the guest's view in its init, and the lab host's view of the same functions. Shell
    builtins only (no process per file) and no line for an empty resource: in the nested
    guest (TCG inside TCG) every fork and every byte on the serial port costs."""
    z = "0x0000000000000000"
    return (
        f"for d in {devices}; do\n"
        "  a=${d##*/}\n"
        "  read v < $d/vendor; read p < $d/device; read c < $d/class\n"
        '  echo "@@dev $a $v $p $c"\n'
        "  i=0\n"
        "  while read s e f; do\n"
        f'    [ "$s $e $f" = "{z} {z} {z}" ] || echo "@@res $a $i $s $e $f"\n'
        "    i=$((i+1))\n"
        "  done < $d/resource\n"
        "done\n"
    )


# busybox-static is the whole userland; nothing else is needed to read sysfs. The kernel's
# PCI messages come from dmesg (they are what a user sees when a BAR finds no space).
INIT = f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
echo {BEGIN}
read up _ < /proc/uptime; echo "@@uptime init $up"
{dump("/sys/bus/pci/devices/*")}dmesg | grep -iE 'BAR |root bus resource|no space|failed to assign' | sed 's/^/@@dmesg /'
read up _ < /proc/uptime; echo "@@uptime end $up"
echo {END}
poweroff -f
"""


def _newc(name: str, mode: int, data: bytes, ino: int) -> bytes:
    """One entry of a cpio "newc" archive, the format the kernel unpacks an initramfs from."""
    fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name) + 1, 0)
    head = b"070701" + b"".join(b"%08X" % f for f in fields) + name.encode() + b"\0"
    head += b"\0" * (-len(head) % 4)
    return head + data + b"\0" * (-len(data) % 4)


def initramfs(busybox: bytes) -> bytes:
    """The nested guest's initramfs (gzip'd newc): busybox-static, INIT, the mount points."""
    entries = [(d, 0o040755, b"") for d in ("bin", "dev", "proc", "sys")]
    entries += [("bin/busybox", 0o100755, busybox), ("init", 0o100755, INIT.encode())]
    archive = b"".join(_newc(n, m, d, i + 1) for i, (n, m, d) in enumerate(entries))
    archive += _newc("TRAILER!!!", 0, b"", 0)
    return gzip.compress(archive, compresslevel=1, mtime=0)


def main() -> int:
    """``python3 nested.py BUSYBOX OUTPUT``: how the lab host writes the initramfs."""
    busybox, output = sys.argv[1:3]
    Path(output).write_bytes(initramfs(Path(busybox).read_bytes()))
    return 0


def boot_xml(xml: str, kernel: str, initrd: str, serial_log: str) -> str:
    """The rendered domain, booting ``kernel`` + ``initrd`` directly through its OVMF
    (secure boot off: Debian's kernel is signed for shim, not for OVMF's enrolled keys),
    the serial console written to ``serial_log``, and a reboot or crash ending the domain."""
    ElementTree.register_namespace("qemu", QEMU_NS)
    doc = ElementTree.fromstring(xml)
    os_el = doc.find("os")
    assert os_el is not None
    for boot in os_el.findall("boot"):
        os_el.remove(boot)
    fw = ElementTree.SubElement(os_el, "firmware")
    ElementTree.SubElement(fw, "feature", enabled="no", name="secure-boot")
    ElementTree.SubElement(os_el, "kernel").text = kernel
    ElementTree.SubElement(os_el, "initrd").text = initrd
    ElementTree.SubElement(os_el, "cmdline").text = "console=ttyS0 panic=-1 quiet loglevel=4"
    for tag in ("on_reboot", "on_crash"):
        el = doc.find(tag)
        if el is not None:
            el.text = "destroy"
    devices = doc.find("devices")
    assert devices is not None
    for tag in ("serial", "console"):
        for el in devices.findall(tag):
            devices.remove(el)
    serial = ElementTree.SubElement(devices, "serial", type="file")
    ElementTree.SubElement(serial, "source", path=serial_log)
    ElementTree.SubElement(serial, "target", type="isa-serial", port="0")
    # No mmap of the vfio BARs: QEMU then maps none of them for DMA (peer to peer), which the
    # lab host's kernel does page by page through the emulated IOMMU, 64 GiB of the stand-in
    # (at least 13.5 min of the boot alone, against 419 s without; docs/lab.md). The guest
    # sees the same BARs at the same addresses: the check reads placement, not contents.
    cmd = doc.find(f"{{{QEMU_NS}}}commandline")
    if cmd is None:
        cmd = ElementTree.SubElement(doc, f"{{{QEMU_NS}}}commandline")
    ElementTree.SubElement(cmd, f"{{{QEMU_NS}}}arg", value="-global")
    ElementTree.SubElement(cmd, f"{{{QEMU_NS}}}arg", value="vfio-pci.x-no-mmap=on")
    return ElementTree.tostring(doc, encoding="unicode")


def without_planner(xml: str, bits: int) -> str:
    """The same domain as a render without the address planner would leave it: no fw_cfg
    window minimum, no ``<pcihole64>``, and the guest CPU's bits at ``bits`` (a count OVMF
    does not trust, so it builds its 32 GiB fallback window)."""
    ElementTree.register_namespace("qemu", QEMU_NS)
    doc = ElementTree.fromstring(xml)
    for root in doc.iter("controller"):
        for hole in root.findall("pcihole64"):
            root.remove(hole)
    cmdline = doc.find(f"{{{QEMU_NS}}}commandline")
    if cmdline is not None:
        args = list(cmdline)
        for i, arg in enumerate(args):
            if "X-PciMmio64Mb" in arg.get("value", ""):
                cmdline.remove(arg)
                if i > 0 and args[i - 1].get("value") == "-fw_cfg":
                    cmdline.remove(args[i - 1])
        if not list(cmdline):
            doc.remove(cmdline)
    cpu = doc.find("cpu")
    assert cpu is not None
    for m in cpu.findall("maxphysaddr"):
        cpu.remove(m)
    cpu.insert(0, ElementTree.Element("maxphysaddr", mode="emulate", bits=str(bits)))
    return ElementTree.tostring(doc, encoding="unicode")


@dataclass
class GuestFunction:
    address: str
    vendor: int
    device: int
    class_code: int
    # (start, end, flags) by the resource line's index, as the kernel prints them; an empty
    # line (all zero) is not printed, so not here
    resources: dict[int, tuple[int, int, int]] = field(default_factory=dict)

    def bar(self, index: int) -> tuple[int, int] | None:
        """(start, size) of BAR ``index``, or None: no BAR there, or one the kernel could not
        place (it zeroes the whole resource then; its log says which)."""
        if index not in self.resources:
            return None
        start, end, flags = self.resources[index]
        if not flags and not start and not end:
            return None
        return start, end - start + 1


@dataclass
class Capture:
    functions: dict[str, GuestFunction]
    dmesg: list[str]


def parse_capture(text: str) -> Capture:
    """The ``@@`` lines between the markers of a serial log; refuses an incomplete one."""
    text = text.replace("\r", "")
    if BEGIN not in text or END not in text:
        raise ValueError("the guest's capture is incomplete (no begin/end marker)")
    body = text.split(BEGIN, 1)[1].split(END, 1)[0]
    functions: dict[str, GuestFunction] = {}
    dmesg: list[str] = []
    for line in body.splitlines():
        if line.startswith("@@dev "):
            _, addr, vendor, device, cls = line.split()
            functions[addr] = GuestFunction(addr, int(vendor, 16), int(device, 16), int(cls, 16))
        elif line.startswith("@@res "):
            _, addr, index, start, end, flags = line.split()
            functions[addr].resources[int(index)] = (int(start, 16), int(end, 16), int(flags, 16))
        elif line.startswith("@@dmesg "):
            dmesg.append(line[len("@@dmesg ") :])
    return Capture(functions, dmesg)


def no_space(capture: Capture, address: str) -> list[str]:
    """The kernel's own words about a BAR of ``address`` it could not place."""
    pattern = re.compile(rf"{re.escape(address)}.*(no space|failed to assign)")
    return [line for line in capture.dmesg if pattern.search(line)]


if __name__ == "__main__":
    raise SystemExit(main())
