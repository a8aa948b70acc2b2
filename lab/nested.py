"""The nested guest that boots: a real kernel through OVMF with a busybox initramfs whose
``init`` prints the guest's own view of its PCI functions (sysfs ``resource`` lines,
vendor/device/class) and the kernel's BAR messages to the serial port, then powers off.

Everything here is text: the lab host builds the initramfs with the shell command below,
the lab edits the domain XML that ``passthrough render`` wrote (direct kernel boot, the
serial port into a file), and reads the capture back with ``parse_capture``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from xml.etree import ElementTree

QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
BEGIN, END = "@@capture-begin", "@@capture-end"


def dump(devices: str) -> str:
    """Shell printing each PCI function's IDs and sysfs ``resource`` lines as ``@@`` lines:
    the guest's view in its init, and the lab host's view of the same functions."""
    return (
        f"for d in {devices}; do\n"
        "  a=${d##*/}\n"
        '  echo "@@dev $a $(cat $d/vendor) $(cat $d/device) $(cat $d/class)"\n'
        "  i=0\n"
        '  while read s e f; do echo "@@res $a $i $s $e $f"; i=$((i+1)); done < $d/resource\n'
        "done\n"
    )


# busybox-static is the whole userland; nothing else is needed to read sysfs. The kernel's
# PCI messages come from dmesg (they are what a user sees when a BAR finds no space).
INIT = f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
echo {BEGIN}
{dump("/sys/bus/pci/devices/*")}dmesg | grep -iE 'BAR |root bus resource|no space|failed to assign' | sed 's/^/@@dmesg /'
echo {END}
poweroff -f
"""


def initramfs_command(directory: str, output: str) -> str:
    """Shell, run inside the lab host: the initramfs from busybox-static and INIT."""
    return (
        f"rm -rf {directory} && mkdir -p {directory}/bin {directory}/proc {directory}/sys "
        f"{directory}/dev && cp /bin/busybox {directory}/bin/busybox && "
        f"cat > {directory}/init <<'LAB_INIT_EOF'\n{INIT}LAB_INIT_EOF\n"
        f"chmod 755 {directory}/init && cd {directory} && "
        f"find . | cpio -o -H newc --quiet | gzip -1 > {output}"
    )


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
    # (start, end, flags) per resource line, as the kernel prints them
    resources: list[tuple[int, int, int]] = field(default_factory=list)

    def bar(self, index: int) -> tuple[int, int] | None:
        """(start, size) of BAR ``index``; None when the kernel has none there; size 0 when
        the BAR exists but got no address (the kernel then shows a zero start)."""
        if index >= len(self.resources):
            return None
        start, end, flags = self.resources[index]
        if not flags and not start and not end:
            return None
        return start, (end - start + 1 if start else 0)


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
            _, addr, _index, start, end, flags = line.split()
            functions[addr].resources.append((int(start, 16), int(end, 16), int(flags, 16)))
        elif line.startswith("@@dmesg "):
            dmesg.append(line[len("@@dmesg ") :])
    return Capture(functions, dmesg)


def no_space(capture: Capture, address: str) -> list[str]:
    """The kernel's own words about a BAR of ``address`` it could not place."""
    pattern = re.compile(rf"{re.escape(address)}.*(no space|failed to assign)")
    return [line for line in capture.dmesg if pattern.search(line)]
