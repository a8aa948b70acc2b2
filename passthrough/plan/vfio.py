# SPDX-License-Identifier: Apache-2.0
"""Binding the selected cards to vfio-pci at boot: modprobe.d, initramfs, per-device overrides.

Softdeps are derived, not listed: every module bound to a card's function now, and every
module whose ``modules.alias`` patterns match a function's modalias, must load after
vfio-pci. Derived from the host's own module database, so a new driver is covered too.
"""

from __future__ import annotations

import fnmatch
import itertools
import re

from passthrough.actions import Run, WriteFile
from passthrough.host.modalias import PLAIN, is_vfio
from passthrough.host.root import HostRoot
from passthrough.kargs import UnsafeCmdline, utf8_text
from passthrough.kernel import kernel_version
from passthrough.model import Host, InitramfsKind, PciFunction

MODPROBE = "etc/modprobe.d/passthrough-vfio.conf"
UDEV_RULE = "etc/udev/rules.d/40-passthrough-vfio.rules"
DRACUT = "etc/dracut.conf.d/10-passthrough-vfio.conf"
MKINITCPIO_DROPIN = "etc/mkinitcpio.conf.d/passthrough-vfio.conf"
INITRAMFS_TOOLS = "etc/initramfs-tools/modules"
MARK = "# passthrough: load vfio-pci early (removed by `passthrough undo`)"
# Our files' comments quote nothing a shell would run: mkinitcpio and dracut source them.
HEADER = "# Written by passthrough: binds the selected GPUs to vfio-pci. 'passthrough undo' removes it.\n"
VFIO_SELF = {"vfio_pci", "vfio_pci_core", "vfio"}
# Modules that sit on top of a matching driver without PCI aliases of their own.
COMPANIONS = {"nvidia": ("nvidia_drm", "nvidia_modeset"), "nouveau": ()}


def early_modules(host: Host) -> list[str]:
    mods = ["vfio_pci", "vfio", "vfio_iommu_type1"]
    version = kernel_version(host.kernel.release)
    if version is not None and version < (6, 2):
        mods.append("vfio_virqfd")  # merged into vfio in 6.2
    return mods


def _norm(module: str) -> str:
    return module.replace("-", "_")


def module_of_driver(root: HostRoot, driver: str) -> str | None:
    """The module behind a bound driver (``xhci_hcd`` is provided by ``xhci_pci``)."""
    name = root.link_name(f"sys/bus/pci/drivers/{driver}/module")
    if name:
        return _norm(name)
    return None


def alias_modules(root: HostRoot, host: Host, functions: list[PciFunction]) -> dict[str, set[str]]:
    """module → the functions' addresses whose modalias its aliases match."""
    release = host.kernel.release
    out: dict[str, set[str]] = {}
    if not release:
        return out
    text = root.read(f"lib/modules/{release}/modules.alias") or ""
    patterns: list[tuple[str, str]] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "alias" and parts[1].startswith("pci:"):
            patterns.append((parts[1], _norm(parts[2])))
    for f in functions:
        if not f.modalias:
            continue
        for pattern, module in patterns:
            if fnmatch.fnmatchcase(f.modalias, pattern):
                out.setdefault(module, set()).add(str(f.address))
    return out


def applied_softdeps(root: HostRoot) -> dict[str, str]:
    """module → the reason our modprobe.d file on the host gives for its softdep."""
    lines = (root.read(MODPROBE) or "").splitlines()
    out: dict[str, str] = {}
    for comment, line in itertools.pairwise(lines):
        m = re.fullmatch(r"softdep (\S+) pre: vfio-pci", line)
        if m and comment.startswith(f"# {m[1]}: "):
            out[m[1]] = comment[len(f"# {m[1]}: ") :]
    return out


def softdeps(root: HostRoot, host: Host, functions: list[PciFunction]) -> dict[str, str]:
    """module → why it needs ``softdep … pre: vfio-pci``.

    Once applied and rebooted the functions are on vfio-pci and "bound to … now" is no longer
    true, so what our file already says stands: a module it lists for a selected function keeps
    its line and reason, and a second run plans no change."""
    why: dict[str, str] = {}
    addresses = {str(f.address) for f in functions}
    for module, reason in applied_softdeps(root).items():
        bound = re.fullmatch(r"bound to (\S+(?:, \S+)*) now", reason)
        if bound and addresses.intersection(bound[1].split(", ")):
            why[module] = reason
    holding: dict[str, list[str]] = {}  # every function a module holds now, not the first
    for f in functions:
        if f.driver and not is_vfio(f.driver):
            module = module_of_driver(root, f.driver) or _norm(f.driver)
            holding.setdefault(module, []).append(str(f.address))
    for module, held in holding.items():
        why.setdefault(module, f"bound to {', '.join(sorted(held))} now")
    for module, addrs in alias_modules(root, host, functions).items():
        why.setdefault(module, "its aliases match " + ", ".join(sorted(addrs)))
    for module in list(why):
        for companion in COMPANIONS.get(module, ()):
            why.setdefault(companion, f"loads {module}")
    builtin = root.read(f"lib/modules/{host.kernel.release}/modules.builtin") or ""
    builtins = {_norm(m.rsplit("/", 1)[-1].split(".ko")[0]) for m in builtin.split()}
    return {
        m: w
        for m, w in sorted(why.items())
        if m not in VFIO_SELF and m not in builtins and m != "pcieport"
    }


def modprobe_conf(ids: list[str], deps: dict[str, str]) -> str:
    lines = [HEADER]
    if ids:
        lines.append(f"options vfio-pci ids={','.join(ids)}\n")
    for module, why in deps.items():
        lines.append(f"# {module}: {why}\n")
        lines.append(f"softdep {module} pre: vfio-pci\n")
    return "".join(lines)


# After the override is set: a host driver that bound the function first is unbound, then
# the kernel re-probes it (the override's driver now). udev's ``$$`` is a literal ``$``; no
# double quotes inside, which older udev cannot escape.
def rebind(driver: str) -> str:
    return (
        f"/bin/sh -c 'd=/sys/bus/pci/devices/%k; case $$(readlink $$d/driver) in */{driver}) ;; "
        "?*) echo %k > $$d/driver/unbind ;; esac; echo %k > /sys/bus/pci/drivers_probe'"
    )


def udev_rule(functions: list[PciFunction], drivers: dict[str, str] | None = None) -> str:
    """driver_override per device, set when the device appears, then the device taken from
    any driver that got there first and re-probed. initramfs-tools copies the rule into the
    initramfs, where it usually runs before any GPU or audio driver loads — but not always:
    the host keeps a device with the same ID (that is why the binding is per device), and
    its driver's module, loaded for that device, probes ours too if its add event has not
    reached this rule yet. The lab caught that race (the kept display's qxl took the card's
    display after a reboot); the unbind closes it. A changed rule rebuilds the initramfs.

    ``drivers`` gives a function its vfio variant driver (address → module, from
    ``modules.alias``; absent: vfio-pci). A variant driver's name is its module's name; it
    has no PCI ID alias of its own, so the rule loads it (udev's kmod builtin) before the
    re-probe."""
    chosen = {str(f.address): (drivers or {}).get(str(f.address), PLAIN) for f in functions}
    lines = [HEADER]
    if PLAIN in chosen.values():
        lines.append("# Identical cards are kept by the host, so IDs cannot tell them apart.\n")
    if set(chosen.values()) - {PLAIN}:
        lines.append("# A vfio variant driver binds only through driver_override.\n")
    for f in functions:
        driver = chosen[str(f.address)]
        load = f'RUN{{builtin}}+="kmod load {driver}", ' if driver != PLAIN else ""
        lines.append(
            f'ACTION=="add", SUBSYSTEM=="pci", KERNEL=="{f.address}", '
            f'ATTR{{driver_override}}="{driver}", {load}RUN+="{rebind(driver)}"\n'
        )
    return "".join(lines)


InitramfsEdits = tuple[list[WriteFile], Run | None, list[str]]


def initramfs_actions(root: HostRoot, host: Host, rule: bool = False) -> InitramfsEdits:
    """The early-loading edits for the host's initramfs tool (as they should read; the
    planner drops those already in place) and the command that rebuilds the image. Every one
    of these tools copies /etc/modprobe.d into the image, and initramfs-tools copies the
    custom rules of /etc/udev/rules.d too (the lab saw the driver_override rule applied inside
    the initramfs): a change to any of those files needs the rebuild, not only these edits.
    dracut copies only the rules its modules name: ``rule`` (the per-device udev rule is in
    use) puts ours in its install_items."""
    mods = early_modules(host)
    kind = host.boot.initramfs
    if kind is InitramfsKind.INITRAMFS_TOOLS:
        return _initramfs_tools(root, mods)
    if kind is InitramfsKind.DRACUT:
        return _dracut(root, mods, rule)
    if kind is InitramfsKind.MKINITCPIO:
        return _mkinitcpio(root, mods)
    return [], None, ["no initramfs tool recognised: vfio-pci binds once the root filesystem is up"]


def _initramfs_tools(root: HostRoot, mods: list[str]) -> InitramfsEdits:
    writes: list[WriteFile] = []
    text = utf8_text(root.read_bytes(INITRAMFS_TOOLS), "/" + INITRAMFS_TOOLS)
    existing = text.splitlines() if text is not None else []
    have = {line.split("#", 1)[0].strip() for line in existing}
    missing = [m for m in mods if m not in have]
    if missing:
        body = (
            (text + "\n" if text and not text.endswith("\n") else text or "")
            + MARK
            + "\n"
            + "".join(f"{m}\n" for m in missing)
        )
        writes.append(
            WriteFile(
                INITRAMFS_TOOLS,
                body.encode(),
                "vfio modules in the initramfs, before GPU drivers",
            )
        )
    return (
        writes,
        Run(
            ("update-initramfs", "-u", "-k", "all"),
            "rebuild every initramfs",
            touches=("boot/initrd.img-*",),
            regenerate=True,
        ),
        [],
    )


def _dracut(root: HostRoot, mods: list[str], rule: bool = False) -> InitramfsEdits:
    later_override(root, DRACUT, "force_drivers")
    # the lab's Debian + dracut boot found the rule missing from the image: the card waited
    # for the real root's udev, after any GPU driver the initramfs loads
    items = " ".join(f"/{p}" for p in (MODPROBE, UDEV_RULE)[: 2 if rule else 1])
    body = HEADER + f'force_drivers+=" {" ".join(mods)} "\n' + f'install_items+=" {items} "\n'
    return (
        [
            WriteFile(
                DRACUT, body.encode(), "vfio modules in the initramfs (dracut reads only *.conf)"
            )
        ],
        Run(
            ("dracut", "-f", "--regenerate-all"),
            "rebuild every initramfs",
            # Fedora's name, and Debian's (dracut writes beside /boot/vmlinuz-R there)
            touches=("boot/initramfs-*.img", "boot/initrd.img-*"),
            regenerate=True,
        ),
        [],
    )


MKINITCPIO = "etc/mkinitcpio.conf"
MKINITCPIO_D = "etc/mkinitcpio.conf.d"
# the last MODULES assignment in either form mkinitcpio accepts: an array or a string
MODULES_LINE = re.compile(r"^[ \t]*MODULES=(?:\(([^)]*)\)|\"([^\"$`\\]*)\")", re.MULTILINE)


def mkinitcpio_dropin(mods: list[str]) -> str:
    """Appends to MODULES as the shell has it when sourced. The unquoted expansion splits a
    string (``MODULES="a b"``) and an array alike, so the admin may use either form, now or
    later. It starts with a newline: mkinitcpio concatenates its files before sourcing them,
    and a file before ours may lack a final newline."""
    return "\n" + HEADER + f"MODULES=(${{MODULES[@]}} {' '.join(mods)})\n"


def later_override(root: HostRoot, ours: str, var: str) -> None:
    """Refuse a file sourced after ``ours`` (same folder, ``*.conf``) that assigns ``var``
    outright: it would drop what ours appends."""
    folder, name = ours.rsplit("/", 1)
    for other in sorted(root.listdir(folder)):
        if not other.endswith(".conf") or other <= name:
            continue
        rel = f"{folder}/{other}"
        text = utf8_text(root.read_bytes(rel), "/" + rel) or ""
        for n, line in enumerate(text.split("\n"), 1):
            if re.match(rf"\s*{var}=", line):
                raise UnsafeCmdline(
                    f"/{rel}:{n}",
                    f"sorts after {name} and sets {var}, so what ours adds would be dropped",
                )


def _mkinitcpio(root: HostRoot, mods: list[str]) -> InitramfsEdits:
    notes: list[str] = []
    writes: list[WriteFile] = []
    regen = Run(
        ("mkinitcpio", "-P"),
        "rebuild every preset's initramfs",
        touches=("boot/initramfs-*.img",),
        regenerate=True,
    )
    conf = utf8_text(root.read_bytes(MKINITCPIO), "/" + MKINITCPIO) or ""
    if "modconf" not in conf:
        notes.append(
            "mkinitcpio.conf has no modconf hook: modprobe.d softdeps will not reach the initramfs"
        )
    if root.isdir(MKINITCPIO_D):
        later_override(root, MKINITCPIO_DROPIN, "MODULES")
        body = mkinitcpio_dropin(mods)
        writes.append(WriteFile(MKINITCPIO_DROPIN, body.encode(), "vfio modules in the initramfs"))
        return writes, regen, notes
    found = list(MODULES_LINE.finditer(conf))
    if not found:
        raise UnsafeCmdline(
            "/" + MKINITCPIO, 'has no MODULES=(...) or MODULES="..." line the planner can edit'
        )
    m = found[-1]  # the shell keeps the last assignment
    group = 1 if m[1] is not None else 2
    present = m[group].split()
    missing = [x for x in mods if x not in present]
    if missing:
        start, end = m.span(group)
        inner = " ".join(missing) + (" " + m[group].lstrip() if m[group].strip() else "")
        new = conf[:start] + inner + conf[end:]
        writes.append(WriteFile(MKINITCPIO, new.encode(), "vfio modules first in the initramfs"))
    return writes, regen, notes
