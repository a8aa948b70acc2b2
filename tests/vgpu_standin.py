# SPDX-License-Identifier: Apache-2.0
"""STAND-INS for NVIDIA's vGPU host driver, which cannot run here (it needs the licensed
driver and a vGPU-capable card): roots built from the real captures in
../shared/realworld/vgpu/ (read at run time, copied into a temporary tree, never into the
project), a stand-in ``sriov-manage`` script and a stand-in for what the kernel driver does
after a write (the catalog shrinking, a write reset to 0, an mdev appearing).

Each behaviour is the documented one (NVIDIA's vGPU user guide; the issue's summary):
``sriov-manage -e PF`` makes the VFs, "Cannot obtain unbindLock" while an NVML client holds
the card; after the first type write the other VFs offer only that framebuffer size and the
configured VF's own catalog is empty; writing 0 deletes the vGPU.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

from passthrough import fakehost
from passthrough.host.root import HostRoot

SETTING = os.environ.get("PASSTHROUGH_REALWORLD", "")
REALWORLD = (
    Path(SETTING)
    if SETTING not in ("", "skip")
    else Path(__file__).parents[1].parent / "shared" / "realworld"
)
VGPU = REALWORLD / "vgpu"
HARVESTER = VGPU / "harvester-pcidevices" / "sys"
L40S_VF = HARVESTER / "bus/pci/devices/0000:26:00.4/nvidia"  # an L40S VF's nvidia/ (23 types)
A2_VF = HARVESTER / "class/mdev_bus/0000:08:01.7"  # an A2 VF in mdev mode

L40S_PF = "0000:26:00.0"
A2_PF = "0000:08:00.0"

_HOST = """\
description: vGPU test host
distro: ubuntu-24.04
cpu: {{vendor: amd, model: "AMD EPYC 9254 24-Core Processor", cpus: 8}}
kernel:
  cmdline: "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro amd_iommu=on iommu=pt"
vendors: {{"10de": NVIDIA Corporation}}
pci:
  - {{addr: "00:00.0", id: "1022:14a4", class: host-bridge}}
  - addr: "00:01.1"
    id: "1022:14ab"
    class: bridge
    children:
{children}
"""


def _vf_addrs(pf: str, first_fn: int, n: int) -> list[str]:
    dom, bus, _ = pf.rsplit(":", 2)[0], pf.split(":")[1], None
    out = []
    for i in range(n):
        devfn = first_fn + i
        out.append(f"{dom.split(':')[0]}:{bus}:{devfn >> 3:02x}.{devfn & 7}")
    return out


def _describe(tmp: Path, pf_id: str, name: str, pf: str, vfs: list[str], total: int) -> Path:
    short = pf[5:]
    lines = [
        f'      - {{addr: "{short}", id: "{pf_id}", class: 3d, driver: nvidia, name: "{name}", '
        f'sriov_totalvfs: {total}, group: 30, bars: {{0: "16M", 1: "64G p64"}}}}'
    ]
    lines += [  # each VF in its own IOMMU group, as behind an ACS-capable port
        f'      - {{addr: "{v[5:]}", id: "{pf_id}", class: 3d, driver: nvidia, physfn: "{short}", '
        f"group: {31 + i}}}"
        for i, v in enumerate(vfs)
    ]
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "host.yaml"
    path.write_text(_HOST.format(children="\n".join(lines)))
    return path


def _writable(tree: Path) -> None:
    for d, _dirs, files in os.walk(tree):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)


def _pf_dir(root: Path, pf: str) -> Path:
    return (root / "sys/bus/pci/devices" / pf).resolve()


def l40s_root(tmp: Path, vfs: int = 4, enabled: bool = True, catalog: str | None = None) -> Path:
    """An L40S (10de:26b9) whose VFs carry the captured ``nvidia/`` directory (or, with
    ``catalog``, that text as their catalog). Not ``enabled``: the VFs are kept aside for
    the stand-in sriov-manage to make."""
    addrs = _vf_addrs(L40S_PF, 4, vfs)
    root = fakehost.build(
        fakehost.load(str(_describe(tmp, "10de:26b9", "AD102GL [L40S]", L40S_PF, addrs, 32))),
        tmp / "root",
    )
    for vf in addrs:
        dest = root / "sys/bus/pci/devices" / vf / "nvidia"
        if catalog is None:
            shutil.copytree(L40S_VF, dest)
            _writable(dest)
        else:  # a catalog of the test's own, in the driver's format
            dest.mkdir()
            (dest / "creatable_vgpu_types").write_text(catalog)
            (dest / "current_vgpu_type").write_text("0\n")
    (_pf_dir(root, L40S_PF) / "sriov_numvfs").write_text(f"{vfs}\n")
    install_sriov_manage(root)
    install_nvidia_smi(root)
    if not enabled:
        stash = root / "usr/lib/nvidia/standin-vfs"
        stash.mkdir(parents=True)
        for vf in addrs:
            real = (root / "sys/bus/pci/devices" / vf).resolve()
            shutil.move(str(real), stash / vf)
            (root / "sys/bus/pci/devices" / vf).unlink()
            (_pf_dir(root, L40S_PF) / f"virtfn{int(vf[-1]) + 8 * int(vf[-4:-2], 16) - 4}").unlink(
                missing_ok=True
            )
        (_pf_dir(root, L40S_PF) / "sriov_numvfs").write_text("0\n")
    return root


def a2_root(tmp: Path) -> Path:
    """An A2 (10de:25b6) with two VFs in mdev mode, each carrying the captured
    ``mdev_supported_types`` (nvidia-742..756; A2-4C has one instance left)."""
    addrs = ["0000:08:01.6", "0000:08:01.7"]
    root = fakehost.build(
        fakehost.load(str(_describe(tmp, "10de:25b6", "GA107GL [A2]", A2_PF, addrs, 16))),
        tmp / "root",
    )
    for vf in addrs:
        dest = root / "sys/bus/pci/devices" / vf / "mdev_supported_types"
        shutil.copytree(A2_VF / "mdev_supported_types", dest)
        _writable(dest)
        for t in dest.iterdir():
            (t / "create").write_text("")
    return root


# -- the stand-in sriov-manage ---------------------------------------------------------------

SRIOV_MANAGE = r"""#!/bin/sh
# STAND-IN for NVIDIA's /usr/lib/nvidia/sriov-manage (tests only): -e PF moves the VFs kept in
# usr/lib/nvidia/standin-vfs into sysfs, -d PF moves them back; "Cannot obtain unbindLock"
# while run/standin-nvml-holder names an NVML client holding the card.
set -eu
R="${PASSTHROUGH_ROOT:?}"
op="$1"; pf="$2"
stash="$R/usr/lib/nvidia/standin-vfs"
devs="$R/sys/bus/pci/devices"
pfdir="$(readlink -f "$devs/$pf")"
if [ -e "$R/run/standin-nvml-holder" ]; then
    echo "Cannot obtain unbindLock for $pf" >&2
    exit 1
fi
n=0
case "$op" in
-e)
    for d in "$stash"/*; do
        [ -d "$d" ] || continue
        vf="$(basename "$d")"
        mv "$d" "$(dirname "$pfdir")/$vf"
        ln -s "$(dirname "$(readlink "$devs/$pf")")/$vf" "$devs/$vf"
        n=$((n + 1))
    done
    echo "$n" > "$pfdir/sriov_numvfs"
    echo "Enabling VFs on $pf"
    ;;
-d)
    mkdir -p "$stash"
    for l in "$devs"/*; do
        vf="$(basename "$l")"
        [ -e "$l/physfn" ] || continue
        [ "$(basename "$(readlink -f "$l/physfn")")" = "$pf" ] || continue
        mv "$(readlink -f "$l")" "$stash/$vf"
        rm "$l"
    done
    echo 0 > "$pfdir/sriov_numvfs"
    echo "Disabling VFs on $pf"
    ;;
*) echo "usage: sriov-manage -e|-d PF|ALL" >&2; exit 2 ;;
esac
"""


def install_script(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def install_sriov_manage(root: Path) -> Path:
    return install_script(root, "usr/lib/nvidia/sriov-manage", SRIOV_MANAGE)


# -- the stand-in nvidia-smi: heterogeneous mode ----------------------------------------------

NVIDIA_SMI = r"""#!/bin/sh
# STAND-IN for NVIDIA's nvidia-smi (tests only). It answers `nvidia-smi vgpu -shm 0|1 -i PF`
# alone: heterogeneous mode on (1) or off (0) for the card, kept in
# usr/lib/nvidia/standin-heterogeneous/PF (gone at a reboot). As the vGPU user guide says, the
# mode is changed only while the card holds no vGPU; run/standin-no-heterogeneous stands for
# a card or driver that cannot do it.
set -eu
R="${PASSTHROUGH_ROOT:?}"
[ "${1:-}" = vgpu ] || { echo "stand-in nvidia-smi: only 'vgpu -shm' is answered" >&2; exit 2; }
shift
mode=""; gpu=""
while [ $# -gt 0 ]; do
    case "$1" in
    -shm) mode="$2"; shift 2 ;;
    -i) gpu="$2"; shift 2 ;;
    *) echo "Invalid combination of input arguments." >&2; exit 2 ;;
    esac
done
case "$mode" in 0|1) ;; *) echo "-shm takes 0 or 1" >&2; exit 2 ;; esac
[ -e "$R/sys/bus/pci/devices/$gpu" ] || { echo "No devices were found" >&2; exit 6; }
if [ -e "$R/run/standin-no-heterogeneous" ]; then
    echo "Setting vGPU heterogeneous mode is not supported for GPU $gpu." >&2
    exit 3
fi
for t in "$R"/sys/bus/pci/devices/*/nvidia/current_vgpu_type; do
    [ -e "$t" ] || continue
    vf="$(dirname "$(dirname "$t")")"
    [ "$(basename "$(readlink -f "$vf/physfn")")" = "$gpu" ] || continue
    if [ "$(cat "$t")" != 0 ]; then
        echo "Unable to set vGPU heterogeneous mode for GPU $gpu: vGPUs exist on it." >&2
        exit 255
    fi
done
state="$R/usr/lib/nvidia/standin-heterogeneous"
mkdir -p "$state"
if [ "$mode" = 1 ]; then : > "$state/$gpu"; word=Enabled; else rm -f "$state/$gpu"; word=Disabled; fi
echo "vGPU heterogeneous mode $word for GPU $gpu."
"""


def install_nvidia_smi(root: Path) -> Path:
    return install_script(root, "usr/bin/nvidia-smi", NVIDIA_SMI)


def heterogeneous_on(root: Path | str, pf: str) -> bool:
    return (Path(root) / "usr/lib/nvidia/standin-heterogeneous" / pf).exists()


# -- the stand-in driver: what the kernel does after a write ---------------------------------

_SIZE = re.compile(r"-(\d+)[A-Z]$")


def _rows(text: str) -> tuple[str, list[tuple[int, str]]]:
    lines = text.splitlines()
    rows = []
    for line in lines[1:]:
        i, _, name = line.partition(":")
        rows.append((int(i), name.strip()))
    return lines[0], rows


def _size(name: str) -> str | None:
    m = _SIZE.search(name)
    return m.group(1) if m else None


class StandinDriver:
    """After a ``current_vgpu_type`` write: with ``resets`` left, the driver puts 0 back (a
    write it did not take); otherwise the configured VF's catalog is emptied and every free
    sibling offers only the types of that framebuffer size (in heterogeneous mode: every type
    that fits in the framebuffer left, the largest type's size being the card's); when every
    VF is back to 0 the full catalog returns. mdev: ``create`` makes the device, ``remove``
    deletes it."""

    def __init__(self, catalog: str, resets: int = 0) -> None:
        self.header, self.full = _rows(catalog)
        self.resets = resets
        self.writes: list[tuple[str, str]] = []

    def __call__(self, root: HostRoot, rel: str, value: str) -> None:
        self.writes.append((rel, value))
        if rel.endswith("nvidia/current_vgpu_type"):
            if self.resets and value != "0":
                self.resets -= 1
                Path(root.real(rel)).write_text("0\n")
            self._catalogs(root)
        elif rel.endswith("/create"):
            self._create(root, rel, value)
        elif rel.startswith("sys/bus/mdev/devices/") and rel.endswith("/remove"):
            uuid = rel.split("/")[4]
            dev = Path(root.real(f"sys/bus/mdev/devices/{uuid}"))
            parent = Path(root.path) / (dev / "parent").read_text().strip()
            shutil.rmtree(dev)
            (parent / uuid).unlink()

    def _catalogs(self, root: HostRoot) -> None:
        base = Path(root.path) / "sys/bus/pci/devices"
        vfs = sorted(p for p in base.iterdir() if (p / "nvidia/current_vgpu_type").exists())
        held = [int((p / "nvidia/current_vgpu_type").read_text()) for p in vfs]
        used = set(held) - {0}
        names = dict(self.full)
        sizes = {_size(names[i]) for i in used if i in names}
        mixed = any(heterogeneous_on(root.path, (p / "physfn").resolve().name) for p in vfs)
        whole = max(int(_size(n) or 0) for _, n in self.full)
        left = whole - sum(int(_size(names.get(i, "")) or 0) for i in held if i)
        for p in vfs:
            mine = int((p / "nvidia/current_vgpu_type").read_text())
            if mine:
                rows: list[tuple[int, str]] = []
            elif mixed:
                rows = [(i, n) for i, n in self.full if int(_size(n) or 0) <= left]
            elif sizes:
                rows = [(i, n) for i, n in self.full if _size(n) in sizes]
            else:
                rows = self.full
            text = "".join(f"{self.header}\n" for _ in [0]) + "".join(
                f"{i:<6}: {n}\n" for i, n in rows
            )
            (p / "nvidia/creatable_vgpu_types").write_text(text)

    def _create(self, root: HostRoot, rel: str, uuid: str) -> None:
        kind = Path(root.real(rel)).parent
        parent = kind.parent.parent
        dev = Path(root.path) / "sys/bus/mdev/devices" / uuid
        dev.mkdir(parents=True)
        (dev / "remove").write_text("")
        (dev / "parent").write_text(os.path.relpath(parent, root.path))
        (parent / uuid).symlink_to(os.path.relpath(dev, parent))  # relative, as sysfs has them
        (dev / "mdev_type").symlink_to(os.path.relpath(kind, dev))
        left = kind / "available_instances"
        left.write_text(f"{max(0, int(left.read_text()) - 1)}\n")
