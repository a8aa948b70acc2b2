# SPDX-License-Identifier: Apache-2.0
"""The modern vfio stack on a current kernel: iommufd (/dev/iommu) and the vfio device cdev
(/dev/vfio/devices/vfioN) on a real kernel under QEMU with the emulated Intel IOMMU, and
the toolkit's check, bind and release on it.

    python lab/modern.py [--keep WORKDIR] [--json]

Which kernel: no Debian kernel is built with CONFIG_IOMMUFD (Debian 13's 6.12, its
backports' 7.3 and sid's 7.2 all have "# CONFIG_IOMMUFD is not set", and
CONFIG_VFIO_DEVICE_CDEV depends on it), so on Debian `check` can only say INFO. The stage
boots the newest generic kernel of Ubuntu 24.04's updates instead (CONFIG_IOMMUFD=m,
CONFIG_VFIO_DEVICE_CDEV=y, virtio-blk and ext4 built in, so it boots without an initramfs),
its files placed in a copy of the lab's cached Debian 12 tree: the kernel is what this
stage tests, the userland stays the lab host's own, and the tree is cached again (rebuilt
when the lab tree's recipe or this one changes).

Stages (each prints its time):
  image    the kernel in a copy of the lab tree (cached), an ext4 image of it
  boot     QEMU q35 + intel-iommu (intremap, caching-mode), direct kernel boot, SSH
  check    `passthrough check --json` before any vfio module: `iommufd` WARN, naming
           `modprobe iommufd`
  bind     `modprobe vfio-pci` (what it loaded is reported), `passthrough bind`: each
           function of the stand-in card on vfio-pci with its /dev/vfio/devices/vfioN, the
           node's numbers those of sysfs' vfio-dev/vfioN/dev
  ready    `passthrough check --json`: `iommufd` names /dev/iommu and each function's node
  release  `passthrough release`: each function back to the driver it had before bind, its
           vfio-dev gone (sysfs)
  rebind   `passthrough bind` again: vfio-pci and the nodes back (sysfs)
"""

from __future__ import annotations

import hashlib
import json
import lzma
import shutil
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import image
import run
from run import CARD, CARD_FUNCTIONS, Lab, LabFailed

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


def tree() -> Path:
    """The lab tree with the current kernel beside Debian 12's (cached)."""
    recipe = f"{image.RECIPE}\n{KERNEL_RECIPE}"
    path = image.CACHE / f"modern-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"
    if (path / ".complete").exists():
        return path
    base = image.tree()
    tmp = path.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    image._run(["cp", "-a", str(base), str(tmp)])
    (tmp / ".complete").unlink()
    release = _install_kernel(tmp)
    (tmp / ".modern-kernel").write_text(release + "\n")
    (tmp / ".complete").write_text(recipe + "\n")
    tmp.rename(path)
    return path


def kernel_of(root: Path) -> str:
    return (root / ".modern-kernel").read_text().strip()


# Under TCG at load 20 this kernel's first boot spent 4.5 minutes in systemd-networkd's start
# (udev still settling the many modules it loads), past networkd's own start timeout: it was
# killed and restarted, and sshd came after the 600 s the lab waits by default
NETWORKD_DROPIN = "[Service]\nTimeoutStartSec=15min\n"


class ModernLab(Lab):
    boot_wait = 1500.0

    def __init__(self, work: Path, artifacts: Path, say: Callable[[str], None] = print) -> None:
        super().__init__(work, artifacts, say)
        self.release = ""
        self.before: dict[str, str] = {}

    def build_modern(self) -> tuple[Path, Path, Path]:
        key = self._key()
        src = tree()
        self.release = kernel_of(src)
        staging = image._staging(src, self.work, (self.work / "id_lab.pub").read_text())
        dropin = staging / "etc/systemd/system/systemd-networkd.service.d"
        dropin.mkdir(parents=True, exist_ok=True)
        (dropin / "lab-tcg.conf").write_text(NETWORKD_DROPIN)
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

    def cdevs(self) -> dict[str, str]:
        """Each card function's vfio-dev/vfioN, checked against its /dev node's numbers."""
        nodes = {}
        for a in CARD_FUNCTIONS:
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

    def bind_cdev(self) -> dict[str, Any]:
        self.before = self.drivers(CARD_FUNCTIONS)
        drivers = self.bind()  # modprobe vfio-pci, bind, the negative case refused
        loaded = self.loaded()
        if self.sh("test -c /dev/iommu").returncode != 0:
            raise LabFailed(f"no /dev/iommu after modprobe vfio-pci (loaded: {loaded})")
        return {"before": self.before, "drivers": drivers, "loaded": loaded, "cdevs": self.cdevs()}

    def ready(self, cdevs: dict[str, str]) -> dict[str, Any]:
        result = self.check_json()
        summary = result["summary"]
        named = all(f"{a} → {n}" in summary for a, n in cdevs.items())
        if result["level"] not in ("PASS", "INFO") or "/dev/iommu" not in summary or not named:
            raise LabFailed(f"iommufd after bind: {result}")
        if result["level"] == "INFO" and "predates iommufd" not in summary:
            raise LabFailed(f"iommufd INFO for something else than versions: {result}")
        return result

    def release_card(self) -> dict[str, Any]:
        r = self.pt(f"release --yes --gpu {CARD} --json")
        if r.returncode != 0:
            raise LabFailed(f"release: rc={r.returncode} {r.stderr.strip()[-500:]}")
        released = json.loads(r.stdout)["released"]
        drivers = self.drivers(CARD_FUNCTIONS)
        if drivers != self.before or released != self.before:
            raise LabFailed(f"release: {released}, sysfs {drivers}, before bind {self.before}")
        left = [
            a
            for a in CARD_FUNCTIONS
            if self.sh(f"test -e /sys/bus/pci/devices/{a}/vfio-dev").returncode == 0
        ]
        if left:
            raise LabFailed(f"vfio-dev still there after release: {left}")
        return {"released": released, "drivers": drivers}

    def rebind(self) -> dict[str, Any]:
        r = self.pt(f"bind --yes --gpu {CARD} --json")
        if r.returncode != 0 or json.loads(r.stdout)["bound"] != CARD_FUNCTIONS:
            raise LabFailed(f"bind again: rc={r.returncode} {r.stdout} {r.stderr.strip()}")
        drivers = self.drivers(CARD_FUNCTIONS)
        if set(drivers.values()) != {"vfio-pci"}:
            raise LabFailed(f"bind again: sysfs says {drivers}")
        return {"drivers": drivers, "cdevs": self.cdevs()}

    def run(self) -> dict[str, Any]:
        def stages() -> dict[str, Any]:
            img, kernel, key = self.stage("image", self.build_modern)
            self.stage("boot", lambda: self.boot(img, kernel, None, key))
            unloaded = self.stage("check", self.check_unloaded)
            bound = self.stage("bind", self.bind_cdev)
            ready = self.stage("ready", lambda: self.ready(bound["cdevs"]))
            released = self.stage("release", self.release_card)
            again = self.stage("rebind", self.rebind)
            return {
                "ok": True,
                "accel": self.accel,
                "kernel": self.release,
                "timings": self.timings,
                "before_modprobe": unloaded,
                "bind": bound,
                "iommufd": ready,
                "release": released,
                "rebind": again,
            }

        return self._guarded(stages)


def main() -> int:
    args = run.parser(__doc__).parse_args()
    return run.lab_main(args, "modern", lambda w, a, say: ModernLab(w, a, say).run())


if __name__ == "__main__":
    raise SystemExit(main())
