# SPDX-License-Identifier: Apache-2.0
"""The modern vfio stack on a current kernel: iommufd (/dev/iommu) and the vfio device cdev
(/dev/vfio/devices/vfioN) on a real kernel under QEMU with the emulated Intel IOMMU, and
the toolkit's check, bind and release on it.

    python lab/modern.py [--keep WORKDIR] [--json] [--nested]

Which kernel: no Debian kernel is built with CONFIG_IOMMUFD (Debian 13's 6.12, its
backports' 7.3 and sid's 7.2 all have "# CONFIG_IOMMUFD is not set", and
CONFIG_VFIO_DEVICE_CDEV depends on it), so on Debian `check` can only say INFO. The stage
boots the newest generic kernel of Ubuntu 24.04's updates instead (CONFIG_IOMMUFD=m,
CONFIG_VFIO_DEVICE_CDEV=y, virtio-blk and ext4 built in, so it boots without an initramfs).

Which userland: a PASS (and a guest on iommufd) needs QEMU 9.0+ and libvirt 12.1+, which only
Debian sid has (trixie-backports has the QEMU, not the libvirt), so the kernel's files are
placed in a debootstrapped sid tree of the lab tree's packages (cached, rebuilt when this
recipe changes; the lab's own Debian 12 tree stays as it is).

Stages (each prints its time):
  image    the sid tree with the kernel (cached), an ext4 image of it
  boot     QEMU q35 + intel-iommu (intremap, caching-mode), direct kernel boot, SSH
  check    `passthrough check --json` before any vfio module: `iommufd` WARN, naming
           `modprobe iommufd`
  bind     `modprobe vfio-pci` (what it loaded is reported), `passthrough bind` of the
           stand-in card and of the second card: each function on vfio-pci with its /dev/vfio/devices/vfioN, the
           node's numbers those of sysfs' vfio-dev/vfioN/dev
  ready    `passthrough check --json`: `iommufd` PASS, naming /dev/iommu and each node
  nested   (only with --nested: 24 min under TCG inside TCG on a quiet machine, up to
           labcore.NESTED_TIMEOUT) `passthrough render --iommufd` for the card, `validate --host-root /`, the guest
           started by the lab host's libvirt: its QEMU's iommufd object and vfio-pci
           devices and the files behind their fds (/proc), then the guest's own view of both
           functions printed by its busybox init on its serial port
  release  `passthrough release` of the second card: back to bochs-drm, the driver it had
           before bind, its vfio-dev gone (sysfs); the first card stays on vfio-pci
  rebind   `passthrough bind` again: vfio-pci and the node back (sysfs)

`release` and `bind` again act on a second card, a bochs-display (driver bochs-drm) behind
its own root port, not on the card's qxl: qxl's re-probe after `release` crashed this kernel
under TCG (a page fault in qxl_irq_handler, "Fatal exception in interrupt"); bochs-drm has no
interrupt handler at all.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import lzma
import re
import shutil
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

sys.path.insert(0, str(Path(__file__).parent))
import image
import machine
import nested
import run
from labcore import CARD, CARD_FUNCTIONS, IMAGES, NESTED, NESTED_MIB, NESTED_TIMEOUT, LabFailed
from run import Lab

ARCHIVE = "http://archive.ubuntu.com/ubuntu"
POCKET = "noble-updates"  # Ubuntu 24.04's updates: its hardware-enablement kernels
FLAVOUR = "generic"
KERNEL_RECIPE = f"{ARCHIVE} {POCKET} main newest linux-image-unsigned-*-{FLAVOUR}\nrev 1"
MODULES_NEEDED = ("iommufd", "vfio", "vfio_pci")


def _index() -> dict[str, dict[str, str]]:
    """The pocket's package index: each package's fields."""
    url = f"{ARCHIVE}/dists/{POCKET}/main/binary-amd64/Packages.xz"
    with urllib.request.urlopen(url, timeout=120) as r:
        text = lzma.decompress(r.read()).decode()
    packages: dict[str, dict[str, str]] = {}
    for stanza in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " "
        )
        if "Package" in fields:
            packages[fields["Package"]] = fields
    return packages


def _release_key(release: str) -> tuple[int, ...]:
    """7.0.0-44-generic → (7, 0, 0, 44)."""
    return tuple(int(x) for x in release.removesuffix(f"-{FLAVOUR}").replace("-", ".").split("."))


def _fetch(fields: dict[str, str], dest: Path) -> Path:
    """A package's .deb, checked against the index's SHA256."""
    path = dest / Path(fields["Filename"]).name
    urllib.request.urlretrieve(f"{ARCHIVE}/{fields['Filename']}", path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != fields["SHA256"]:
        raise RuntimeError(f"{path.name}: sha256 {digest}, the index says {fields['SHA256']}")
    return path


def _install_kernel(tmp: Path) -> str:
    """The newest generic kernel's image and modules unpacked into the tree (not through
    dpkg: an Ubuntu kernel's dependencies name Ubuntu's linux-base), its modules indexed
    by the tree's own depmod. Returns its release."""
    index = _index()
    prefix = "linux-image-unsigned-"
    release = max(
        (
            name[len(prefix) :]
            for name in index
            if name.startswith(prefix) and name.endswith(f"-{FLAVOUR}")
        ),
        key=_release_key,
    )
    debs = tmp.parent / f"{tmp.name}-debs"
    shutil.rmtree(debs, ignore_errors=True)
    debs.mkdir()
    unpacked = debs / "root"
    try:
        for name in (f"{prefix}{release}", f"linux-modules-{release}"):
            image._run(["dpkg-deb", "-x", str(_fetch(index[name], debs)), str(unpacked)])
        for sub in ("boot", "lib/modules"):
            src = unpacked / sub
            if not src.is_dir():
                src = unpacked / "usr" / sub
            # the tree's /lib is usr/lib (merged /usr): copy into the real directory
            dst = tmp / ("usr/lib/modules" if sub == "lib/modules" else sub)
            dst.mkdir(parents=True, exist_ok=True)
            image._run(["cp", "-a", f"{src}/.", str(dst)])
    finally:
        shutil.rmtree(debs, ignore_errors=True)
    image._run(["chroot", str(tmp), "depmod", "-a", release])
    return release


# The lab host's userland: Debian sid, the one Debian suite with both QEMU 9.0+ and libvirt
# 12.1+ (on 2026-11-27: sid QEMU 11.1.3, libvirt 12.8.0; trixie-backports has QEMU 11.1.3
# but no libvirt, trixie itself QEMU 10.0 and libvirt 11.3). The lab tree's packages less
# Debian's kernel, its initramfs tools and GRUB (the stage boots Ubuntu's kernel directly)
SUITE = "sid"
PACKAGES = (
    "systemd-sysv,udev,kmod,openssh-server,python3,pciutils,iproute2,ca-certificates,sudo,"
    "dbus,libpam-systemd,libvirt-daemon-system,libvirt-daemon-driver-qemu,libvirt-clients,"
    "qemu-system-x86,ovmf,python3-libvirt,python3-jinja2,python3-lxml,python3-yaml,"
    "python3-pyudev,python3-pycdlib,busybox-static"
)
RECIPE = (
    f"debootstrap --variant=minbase --include={PACKAGES} {SUITE} {image.MIRROR}\n"
    f"{image.NETWORK}\nuseradd {image.USER}\n{image.SUDOERS}{image.HOSTS}rev 1\n{KERNEL_RECIPE}"
)


def _prepare(tmp: Path) -> None:
    """The lab tree's own finishing (name, network, the lab user), then Ubuntu's kernel."""
    image._prepare_lab(tmp)
    (tmp / ".modern-kernel").write_text(_install_kernel(tmp) + "\n")


def tree() -> Path:
    """Debian sid's userland with Ubuntu's current kernel (cached; rebuilt when the recipe
    changes). The lab's own Debian 12 tree is not touched."""
    return image.cached_debootstrap(image.CACHE, "modern-sid", PACKAGES, RECIPE, _prepare, SUITE)


def kernel_of(root: Path) -> str:
    return (root / ".modern-kernel").read_text().strip()


def qemu_args(argv: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ``-object`` and ``-device`` arguments of a QEMU command line as dicts, whether
    libvirt wrote them as JSON or as ``key=value`` lists (the first bare word the type)."""
    out: dict[str, list[dict[str, Any]]] = {"-object": [], "-device": []}
    for flag, value in itertools.pairwise(argv):
        if flag not in out:
            continue
        if value.startswith("{"):
            out[flag].append(json.loads(value))
            continue
        parsed: dict[str, Any] = {}
        for i, part in enumerate(value.split(",")):
            key, eq, val = part.partition("=")
            if eq:
                parsed[key] = val
            elif i == 0:
                parsed["qom-type" if flag == "-object" else "driver"] = key
        out[flag].append(parsed)
    return out["-object"], out["-device"]


def hostdev_addresses(xml: str) -> dict[str, str]:
    """Each PCI hostdev on iommufd (``<driver iommufd='yes'/>``): its host address → the
    address the guest's kernel gives it (each card on its own guest root port, whose bus
    number firmware assigns in the order of the ports)."""
    out = {}
    for hd in ElementTree.fromstring(xml).iter("hostdev"):
        driver, src, guest = hd.find("driver"), hd.find("source/address"), hd.find("address")
        if driver is None or driver.get("iommufd") != "yes" or src is None or guest is None:
            continue
        host = "{:04x}:{:02x}:{:02x}.{:x}".format(
            *(int(src.get(k, "0"), 16) for k in ("domain", "bus", "slot", "function"))
        )
        bus, fn = int(guest.get("bus", "0"), 16), int(guest.get("function", "0"), 16)
        out[host] = f"0000:{bus:02x}:00.{fn:x}"
    return out


# The plain (not Secure Boot) OVMF of sid's ovmf package, as its descriptor 60-edk2-x86_64.json
# maps it. With only secure boot turned off, sid's libvirt 12.8 picks
# 60-edk2-x86_64-amdsev.json instead (the same priority, first by name), whose firmware boots
# only its own embedded GRUB ("BdsDxe: No bootable option was found")
OVMF_CODE = "/usr/share/OVMF/OVMF_CODE_4M.fd"
OVMF_VARS = "/usr/share/OVMF/OVMF_VARS_4M.fd"
# Ubuntu's 7.0 kernel as nested guest oopsed in that OVMF's runtime SetVariable while
# entering EFI virtual mode; the guest's init needs no EFI runtime service
NESTED_APPEND = "efi=noruntime"
NESTED_KERNEL, NESTED_INITRD = f"{IMAGES}/nested-vmlinuz", f"{IMAGES}/nested-initrd.gz"


def nested_boot_xml(xml: str, serial_log: str) -> str:
    """The rendered domain as the lab boots it (lab/nested.py: direct kernel boot of
    NESTED_KERNEL with the busybox initramfs, serial into ``serial_log``), the plain OVMF
    named and NESTED_APPEND on the kernel's command line."""
    doc = ElementTree.fromstring(nested.boot_xml(xml, NESTED_KERNEL, NESTED_INITRD, serial_log))
    os_el = doc.find("os")
    assert os_el is not None
    loader = ElementTree.SubElement(os_el, "loader", readonly="yes", type="pflash")
    loader.text = OVMF_CODE
    ElementTree.SubElement(os_el, "nvram", template=OVMF_VARS)
    cmdline = os_el.find("cmdline")
    assert cmdline is not None
    cmdline.text = f"{cmdline.text} {NESTED_APPEND}"
    return ElementTree.tostring(doc, encoding="unicode")


# A second, one-function card for `release` and `bind` again: QEMU's bochs-display (1234:1111,
# display class; driver bochs-drm, built as a module of this kernel and loaded by udev at
# boot: a plain framebuffer with no interrupt handler) behind its own root port, so its own
# IOMMU group. Not the card's qxl: under this kernel and TCG, qxl's re-probe after `release`
# crashed the machine (a page fault in qxl_irq_handler, "Fatal exception in interrupt"). The
# card with the nested guest stays the rest of the lab's.
DISPLAY_PORT = "0000:00:08.0"
DISPLAY_DEVICES = [
    "-device",
    "pcie-root-port,id=rp3,chassis=3,slot=3,bus=pcie.0,addr=0x8",
    "-device",
    "bochs-display,bus=rp3,addr=0x0",
]
DISPLAY_DRIVER = "bochs-drm"


class ModernMachine(machine.LabMachine):
    def argv(self) -> list[str]:
        argv = super().argv()
        at = argv.index("-display")
        return [*argv[:at], *DISPLAY_DEVICES, *argv[at:]]


# Under TCG at load 20 this kernel's first boot spent 4.5 minutes in systemd-networkd's start
# (udev still settling the many modules it loads), past networkd's own start timeout: it was
# killed and restarted, and sshd came after the 600 s the lab waits by default
NETWORKD_DROPIN = "[Service]\nTimeoutStartSec=15min\n"


class ModernLab(Lab):
    boot_wait = 1500.0

    def __init__(self, work: Path, artifacts: Path, say: Callable[[str], None] = print) -> None:
        super().__init__(work, artifacts, say)
        self.release = ""
        # the nested guest on iommufd (--nested): about 24 minutes more, so asked for
        self.nested = False
        self.before: dict[str, str] = {}

    def build_modern(self) -> tuple[Path, Path, Path]:
        key = self._key()
        src = tree()
        self.release = kernel_of(src)
        staging = image._staging(src, self.work, (self.work / "id_lab.pub").read_text())
        dropin = staging / "etc/systemd/system/systemd-networkd.service.d"
        dropin.mkdir(parents=True, exist_ok=True)
        (dropin / "lab-tcg.conf").write_text(NETWORKD_DROPIN)
        # the nested guest's kernel and initramfs, written here rather than inside the TCG
        # machine: the lab's Debian 12 kernel (the full chain's nested guest, which reaches
        # its init under TCG inside TCG in minutes) and lab/nested.py's busybox init
        lab_tree = image.tree()
        images = staging / IMAGES.lstrip("/")
        images.mkdir(parents=True, exist_ok=True)
        nested_kernel = lab_tree / f"boot/vmlinuz-{image.release_of(lab_tree)}"
        shutil.copyfile(nested_kernel, images / Path(NESTED_KERNEL).name)
        busybox = (staging / "bin/busybox").read_bytes()
        (images / Path(NESTED_INITRD).name).write_bytes(nested.initramfs(busybox))
        img = self.work / "modern.img"
        img.unlink(missing_ok=True)
        image._run(["mkfs.ext4", "-q", "-F", "-L", "labroot", "-d", str(staging), str(img), "3G"])
        shutil.rmtree(staging)
        return img, src / f"boot/vmlinuz-{self.release}", key

    def check_json(self) -> dict[str, Any]:
        r = self.pt("check --json")
        if not r.stdout.strip():
            raise LabFailed(f"check printed nothing: rc={r.returncode} {r.stderr.strip()[-500:]}")
        data: dict[str, Any] = json.loads(r.stdout)
        return next(c for c in data["checks"] if c["id"] == "iommufd")

    def check_unloaded(self) -> dict[str, Any]:
        """The booted kernel is the one asked for, and before any vfio module the check says
        what to load."""
        uname = self.sh("uname -r").stdout.strip()
        if uname != self.release:
            raise LabFailed(f"booted {uname}, not {self.release}")
        loaded = self.loaded()
        if loaded:
            raise LabFailed(f"loaded at boot already: {loaded}")
        result = self.check_json()
        if result["level"] != "WARN" or "modprobe iommufd" not in (result["fix"] or ""):
            raise LabFailed(f"iommufd before modprobe: {result}")
        return result

    def loaded(self) -> list[str]:
        return [m for m in MODULES_NEEDED if self.sh(f"test -d /sys/module/{m}").returncode == 0]

    def cdevs(self, functions: list[str] = CARD_FUNCTIONS) -> dict[str, str]:
        """Each function's vfio-dev/vfioN, checked against its /dev node's numbers."""
        nodes = {}
        for a in functions:
            r = self.sh(
                f"cd /sys/bus/pci/devices/{a}/vfio-dev && n=$(ls) && echo $n "
                '&& cat $n/dev && stat -c "%t %T" /dev/vfio/devices/$n'
            )
            lines = r.stdout.split("\n")
            if r.returncode != 0 or len(lines) < 3:
                raise LabFailed(f"{a}: no vfio-dev cdev: {r.stdout} {r.stderr.strip()}")
            major, minor = (int(x) for x in lines[1].split(":"))
            if lines[2].split() != [f"{major:x}", f"{minor:x}"]:
                raise LabFailed(
                    f"{a}: /dev/vfio/devices/{lines[0]} is {lines[2]}, sysfs {lines[1]}"
                )
            nodes[a] = f"/dev/vfio/devices/{lines[0]}"
        return nodes

    def display(self) -> str:
        """The second card's address: the one function behind DISPLAY_PORT."""
        r = self.sh(f"ls /sys/bus/pci/devices/{DISPLAY_PORT}")
        # its children: the function, and the port's own service devices (0000:00:08.0:pcie001)
        found = [
            n
            for n in r.stdout.split()
            if re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]", n)
        ]
        if r.returncode != 0 or len(found) != 1:
            raise LabFailed(f"behind {DISPLAY_PORT}: {r.stdout} {r.stderr.strip()}")
        return found[0]

    def bind_cdev(self) -> dict[str, Any]:
        self.before = self.drivers(CARD_FUNCTIONS)
        drivers = self.bind()  # modprobe vfio-pci, bind, the negative case refused
        loaded = self.loaded()
        if self.sh("test -c /dev/iommu").returncode != 0:
            raise LabFailed(f"no /dev/iommu after modprobe vfio-pci (loaded: {loaded})")
        second = self.display()
        before = self.drivers([second])
        if before[second] != DISPLAY_DRIVER:
            raise LabFailed(f"{second} is on {before[second]!r} at boot, not {DISPLAY_DRIVER}")
        r = self.pt(f"bind --yes --gpu {second} --json")
        if r.returncode != 0 or json.loads(r.stdout)["bound"] != [second]:
            raise LabFailed(f"bind {second}: rc={r.returncode} {r.stdout} {r.stderr.strip()}")
        after = self.drivers([second])
        if after[second] != "vfio-pci":
            raise LabFailed(f"bind {second}: sysfs says {after}")
        return {
            "before": self.before,
            "drivers": drivers,
            "loaded": loaded,
            "cdevs": self.cdevs(),
            "display": {"address": second, "before": before, "cdevs": self.cdevs([second])},
        }

    def ready(self, cdevs: dict[str, str]) -> dict[str, Any]:
        """`check --json` on the sid userland (QEMU and libvirt new enough): `iommufd` PASS,
        naming /dev/iommu and each function's node."""
        result = self.check_json()
        summary = result["summary"]
        named = all(f"{a} → {n}" in summary for a, n in cdevs.items())
        if result["level"] != "PASS" or "/dev/iommu" not in summary or not named:
            raise LabFailed(f"iommufd after bind: {result}")
        return result

    def boot(self, *args: Any, **kwargs: Any) -> float:
        """The lab's boot on ModernMachine (with the second card, the bochs-display)."""
        lab_machine = machine.LabMachine
        machine.LabMachine = ModernMachine  # type: ignore[misc]
        try:
            return super().boot(*args, **kwargs)
        finally:
            machine.LabMachine = lab_machine  # type: ignore[misc]

    def qemu_view(self, cdevs: dict[str, str]) -> dict[str, Any]:
        """The running nested guest's QEMU as the lab host sees it: the command line libvirt
        built (one ``iommufd`` object, a ``vfio-pci`` device on it for each function) and
        what the file descriptors it names are (/proc/PID/fd): the object's /dev/iommu, each
        device's own /dev/vfio/devices/vfioN. libvirt opens them and passes them by number
        (``"fd":"N"``), so the fd is what names the host function."""
        pid = self.sh(f"cat /run/libvirt/qemu/{NESTED}.pid").stdout.strip()
        argv = self.sh(f"tr '\\0' '\\n' < /proc/{pid}/cmdline").stdout.splitlines()
        links = self.sh(f"cd /proc/{pid}/fd && for f in *; do echo $f $(readlink $f); done")
        fd = dict(line.split(" ", 1) for line in links.stdout.splitlines() if " " in line)
        objects, devices = qemu_args(argv)
        backends = {
            o["id"]: fd.get(str(o.get("fd"))) for o in objects if o.get("qom-type") == "iommufd"
        }
        node_of = {n: a for a, n in cdevs.items()}
        vfio = {}
        for d in devices:
            if d.get("driver") == "vfio-pci":
                node = fd.get(str(d.get("fd"))) or f"host={d.get('host')}"
                vfio[node_of.get(node, node)] = {"iommufd": d.get("iommufd"), "fd": node}
        problems = []
        if list(backends.values()) != ["/dev/iommu"]:
            problems.append(f"iommufd objects {backends} (id: the file its fd is)")
        for a in CARD_FUNCTIONS:
            if a not in vfio or vfio[a]["iommufd"] not in backends:
                problems.append(f"{a} ({cdevs[a]}) is no vfio-pci device on iommufd")
        held = sorted(
            f for f in set(fd.values()) if f == "/dev/iommu" or f.startswith("/dev/vfio/")
        )
        if "/dev/vfio/vfio" in held:
            problems.append("QEMU holds the legacy container /dev/vfio/vfio open")
        if problems:
            raise LabFailed(f"the nested guest's QEMU: {'; '.join(problems)}; argv {argv}")
        return {"pid": int(pid), "iommufd": backends, "vfio_pci": vfio, "fds": held}

    def nested_iommufd(self, cdevs: dict[str, str]) -> dict[str, Any]:
        """A nested guest on iommufd: `render --iommufd` for the card, `validate --host-root
        /`, then defined and started by the lab host's own libvirt (direct kernel boot, TCG
        inside TCG): its QEMU read while it runs, then the guest's own view of the card's
        functions from its serial log once its init has powered it off."""
        path = f"/tmp/{NESTED}-rendered.xml"
        r = self.pt(
            f"render --iommufd --gpu {CARD} --name {NESTED} --vcpus 1 --memory {NESTED_MIB} "
            f"--network none --virt-type qemu -o {path}"
        )
        if r.returncode != 0:
            raise LabFailed(f"render --iommufd: rc={r.returncode} {r.stderr.strip()[-800:]}")
        validated = self.pt(f"validate --host-root / --json {path}")
        if validated.returncode != 0:
            raise LabFailed(f"validate --host-root /: {validated.stdout[-1500:]}")
        xml = self.sh(f"cat {path}").stdout
        (self.work / f"{NESTED}-rendered.xml").write_text(xml)
        self.artifact_files.append(self.work / f"{NESTED}-rendered.xml")
        addresses = hostdev_addresses(xml)
        if sorted(addresses) != CARD_FUNCTIONS:
            raise LabFailed(f"render --iommufd: the hostdevs on iommufd are {addresses}")
        devices = " ".join(f"/sys/bus/pci/devices/{a}" for a in CARD_FUNCTIONS)
        host = nested.parse_capture(
            self.sh(f"echo {nested.BEGIN}; {nested.dump(devices)}echo {nested.END}").stdout
        )
        log = f"{IMAGES}/{NESTED}-iommufd-serial.log"
        booted = nested_boot_xml(xml, log)
        (self.work / f"{NESTED}-iommufd.xml").write_text(booted)
        self.artifact_files.append(self.work / f"{NESTED}-iommufd.xml")
        self.sh(f"cat > /tmp/{NESTED}.xml <<'LAB_XML_EOF'\n{booted}\nLAB_XML_EOF")
        virsh = "virsh -c qemu:///system"
        r = self.sh(f"rm -f {log}; {virsh} define /tmp/{NESTED}.xml && {virsh} start {NESTED}")
        if r.returncode != 0:
            raise LabFailed(f"starting the nested guest: {r.stderr.strip()[-800:]}")
        started = time.monotonic()
        try:
            qemu = self.qemu_view(cdevs)
            state = "running"
            while time.monotonic() - started < NESTED_TIMEOUT and state == "running":
                time.sleep(10)
                state = self.sh(f"{virsh} domstate {NESTED}").stdout.strip()
            seconds = time.monotonic() - started
            text = self.sh(f"cat {log}").stdout
            (self.work / f"{NESTED}-iommufd-serial.log").write_text(text)
            self.artifact_files.append(self.work / f"{NESTED}-iommufd-serial.log")
        finally:
            self.sh(f"{virsh} destroy {NESTED}; {virsh} undefine --nvram {NESTED}")
        if state == "running":
            raise LabFailed(
                f"the nested guest still runs after {seconds:.0f}s; serial ends: {text[-600:]}"
            )
        try:
            capture = nested.parse_capture(text)
        except ValueError as exc:
            raise LabFailed(f"the nested guest: {exc}; serial ends: {text[-600:]}") from None
        # each function found in the guest by its IDs (vendor, device, class) — at the
        # address the XML gave it where the guest's firmware numbered the buses so
        guest, problems = {}, []
        for a, expected in addresses.items():
            h = host.functions[a]
            ids = (h.vendor, h.device, h.class_code)
            found = [
                g_addr
                for g_addr, g in sorted(capture.functions.items())
                if (g.vendor, g.device, g.class_code) == ids
            ]
            at = expected if expected in found else found[0] if len(found) == 1 else None
            if at is None:
                problems.append(f"{a} ({h.vendor:04x}:{h.device:04x}) in the guest at {found}")
                continue
            g = capture.functions[at]
            guest[a] = {
                "guest": at,
                "expected": expected,
                "id": f"{g.vendor:04x}:{g.device:04x}",
                "class": f"{g.class_code:06x}",
                "bars": [b for i in range(6) if (b := g.bar(i)) is not None],
            }
        if problems:
            raise LabFailed("; ".join(problems))
        return {"seconds": seconds, "qemu": qemu, "guest": guest}

    def release_card(self, second: str, before: dict[str, str]) -> dict[str, Any]:
        """`release` of the second card: back to the driver it had before bind, confirmed by
        sysfs, its vfio-dev gone; the first card (not selected) stays on vfio-pci."""
        r = self.pt(f"release --yes --gpu {second} --json")
        if r.returncode != 0:
            raise LabFailed(f"release: rc={r.returncode} {r.stderr.strip()[-500:]}")
        released = json.loads(r.stdout)["released"]
        drivers = self.drivers([second])
        if drivers != before or released != before:
            raise LabFailed(f"release: {released}, sysfs {drivers}, before bind {before}")
        if self.sh(f"test -e /sys/bus/pci/devices/{second}/vfio-dev").returncode == 0:
            raise LabFailed(f"vfio-dev still there after release: {second}")
        card = self.drivers(CARD_FUNCTIONS)
        if set(card.values()) != {"vfio-pci"}:
            raise LabFailed(f"release of {second} moved the card too: {card}")
        return {"released": released, "drivers": drivers, "card": card}

    def rebind(self, second: str) -> dict[str, Any]:
        r = self.pt(f"bind --yes --gpu {second} --json")
        if r.returncode != 0 or json.loads(r.stdout)["bound"] != [second]:
            raise LabFailed(f"bind again: rc={r.returncode} {r.stdout} {r.stderr.strip()}")
        drivers = self.drivers([second])
        if set(drivers.values()) != {"vfio-pci"}:
            raise LabFailed(f"bind again: sysfs says {drivers}")
        return {"drivers": drivers, "cdevs": self.cdevs([second])}

    def run(self) -> dict[str, Any]:
        def stages() -> dict[str, Any]:
            img, kernel, key = self.stage("image", self.build_modern)
            self.stage("boot", lambda: self.boot(img, kernel, None, key))
            unloaded = self.stage("check", self.check_unloaded)
            bound = self.stage("bind", self.bind_cdev)
            display = bound["display"]
            nodes = {**bound["cdevs"], **display["cdevs"]}
            ready = self.stage("ready", lambda: self.ready(nodes))
            guest = (
                self.stage("nested", lambda: self.nested_iommufd(bound["cdevs"]))
                if self.nested
                else None
            )
            second = display["address"]
            released = self.stage("release", lambda: self.release_card(second, display["before"]))
            again = self.stage("rebind", lambda: self.rebind(second))
            return {
                "ok": True,
                "accel": self.accel,
                "kernel": self.release,
                "timings": self.timings,
                "before_modprobe": unloaded,
                "bind": bound,
                "iommufd": ready,
                "nested": guest,
                "release": released,
                "rebind": again,
            }

        return self._guarded(stages)


def main() -> int:
    p = run.parser(__doc__)
    p.add_argument("--nested", action="store_true", help="also the nested guest on iommufd")
    args = p.parse_args()

    def modern_lab(work: Path, artifacts: Path, say: Callable[[str], None]) -> dict[str, Any]:
        lab = ModernLab(work, artifacts, say)
        lab.nested = args.nested
        return lab.run()

    return run.lab_main(args, "modern", modern_lab)


if __name__ == "__main__":
    raise SystemExit(main())
