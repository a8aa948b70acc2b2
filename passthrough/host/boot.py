# SPDX-License-Identifier: Apache-2.0
"""How the root boots: its bootloader (with the evidence), for GRUB which files the root's
own grub-mkconfig sources, and its initramfs tool. Each reader takes the root and reads
only below it."""

from __future__ import annotations

import re
from dataclasses import replace

from passthrough.errors import MalformedHostData
from passthrough.host.facts import read_distro
from passthrough.host.root import HostRoot
from passthrough.model import DIRECT_BOOT, Boot, BootloaderKind, GrubReading, InitramfsKind, Kernel

# systemd-boot announces itself to the OS through this EFI variable (Boot Loader Interface).
LOADER_INFO_VAR = "LoaderInfo-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"


def _tool(root: HostRoot, name: str) -> str | None:
    for d in ("usr/sbin", "usr/bin", "sbin", "bin", "usr/local/sbin", "usr/local/bin"):
        if root.exists(f"{d}/{name}"):
            return f"/{d}/{name}"
    return None


# How grub-mkconfig names the configuration it sources: "${sysconfdir}" (set to /etc at
# build time, upstream and Debian alike) or a literal /etc, quoted or not.
_ETC = r'(?:"?\$\{sysconfdir\}"?|"?\$sysconfdir"?|"?/etc)'
_SOURCES_MAIN = re.compile(rf'^[ \t]*(?:\.|source)[ \t]+{_ETC}/default/grub"?[ \t]*(?:;|$)', re.M)
# Debian's patch: for x in ${sysconfdir}/default/grub.d/*.cfg ; do … . "${x}" … done
_DROPIN_LOOP = re.compile(
    rf"^[ \t]*for[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]+in[ \t]+{_ETC}/default/grub\.d/\*\.cfg\b",
    re.M,
)
_SYSCONFDIR = re.compile(r'^[ \t]*sysconfdir=(?:"([^"]*)"|(\S*))[ \t]*$', re.M)
GRUB_SCRIPT_LIMIT = 1 << 20  # upstream's and Debian's are under 10 KiB


def _sources_dropins(text: str) -> bool:
    """Whether a ``for`` over grub.d/*.cfg sources its loop variable (Debian's patch)."""
    for m in _DROPIN_LOOP.finditer(text):
        var = re.escape(m[1])
        body = re.compile(rf'^[ \t]*(?:.*[;&|][ \t]*)?(?:\.|source)[ \t]+"?\$\{{?{var}\}}?"?', re.M)
        if body.search(text, m.end()):
            return True
    return False


def _bls(root: HostRoot) -> bool:
    """Fedora's and RHEL's grub2 reads each kernel's arguments from its BLS entry when
    GRUB_ENABLE_BLSCFG=true, not from GRUB_CMDLINE_LINUX."""
    text = root.read("etc/default/grub") or ""
    enabled = re.search(r"""^\s*GRUB_ENABLE_BLSCFG=["']?true["']?\s*$""", text, re.M)
    return enabled is not None and any(
        e.endswith(".conf") for e in root.listdir("boot/loader/entries")
    )


def read_grub(root: HostRoot) -> GrubReading:
    """Learn from the root's own grub-mkconfig (a shell script) which files it sources:
    upstream's reads /etc/default/grub only, Debian's patched one also grub.d/*.cfg."""
    script = _tool(root, "grub-mkconfig") or _tool(root, "grub2-mkconfig")
    grub2 = script is not None and script.endswith("grub2-mkconfig")
    grub_cfg = "boot/grub2/grub.cfg" if grub2 else "boot/grub/grub.cfg"
    name = (script or "/grub-mkconfig").rsplit("/", 1)[1]
    # update-grub (Debian's wrapper) where there is one, else grub-mkconfig as documented
    update = _tool(root, "update-grub") is not None
    regenerate = ("update-grub",) if update else (name, "-o", "/" + grub_cfg)
    if script is None:
        why = "no grub-mkconfig or grub2-mkconfig on this root, so how GRUB reads "
        return GrubReading(
            None, None, why + "/etc/default/grub cannot be told", regenerate, grub_cfg
        )
    try:
        data = root.read_bytes(script.lstrip("/"), limit=GRUB_SCRIPT_LIMIT)
    except MalformedHostData:
        data = None
    text = data.decode("utf-8", "replace") if data is not None else None
    if text is None or not text.startswith("#!"):
        why = f"{script} is not a readable shell script, so how it reads /etc/default/grub cannot be told"
        return GrubReading(script, None, why, regenerate, grub_cfg)
    sysconf = _SYSCONFDIR.search(text)
    if "sysconfdir" in text and (sysconf is None or (sysconf[1] or sysconf[2]) != "/etc"):
        why = f"{script} does not set sysconfdir=/etc, so which files it sources cannot be told"
        return GrubReading(script, None, why, regenerate, grub_cfg)
    if not _SOURCES_MAIN.search(text):
        why = f"{script} does not source /etc/default/grub in a way the planner recognises"
        return GrubReading(script, None, why, regenerate, grub_cfg)
    if _bls(root):
        why = (
            "GRUB_ENABLE_BLSCFG=true with entries in /boot/loader/entries: the kernel line "
            f"comes from those entries, which {name} does not rewrite (grubby does)"
        )
        return GrubReading(script, None, why, regenerate, grub_cfg)
    if _sources_dropins(text):
        why = f"{script} sources /etc/default/grub, then /etc/default/grub.d/*.cfg"
        return GrubReading(script, True, why, regenerate, grub_cfg)
    why = f"{script} sources /etc/default/grub only (upstream GRUB: no grub.d)"
    return GrubReading(script, False, why, regenerate, grub_cfg)


PBT_UUIDS = "etc/kernel/proxmox-boot-uuids"
PBT_HEADER = "etc/grub.d/000_proxmox_boot_header"


def _proxmox_grub(root: HostRoot, grub: GrubReading, pbt: str, uefi: bool) -> GrubReading:
    """proxmox-boot-tool keeping its ESPs for GRUB: each ESP's grub.cfg is update-grub's,
    made from /etc/default/grub, and update-grub reaches the ESPs through Proxmox's grub.d
    header (it runs ``proxmox-boot-tool refresh``); without that header it cannot."""
    how = "booted by BIOS" if not uefi else "GRUB booted it: no LoaderInfo EFI variable"
    if not root.exists(PBT_HEADER):
        why = (
            f"{pbt} keeps the ESPs for GRUB ({how}), and /{PBT_HEADER} is missing: "
            "update-grub would not refresh the ESPs, so what the next boot reads cannot be told"
        )
        return replace(grub, dropins=None, why=why)
    why = (
        f"{grub.why}; {pbt} keeps the ESPs for GRUB ({how}): update-grub refreshes them "
        f"(/{PBT_HEADER})"
    )
    return replace(grub, why=why)


def read_boot(root: HostRoot, kernel: Kernel) -> Boot:
    uefi = root.isdir("sys/firmware/efi")
    evidence: list[str] = []
    kind = BootloaderKind.UNKNOWN
    grub: GrubReading | None = None
    efivars = root.listdir("sys/firmware/efi/efivars")
    sd_booted = any(n.startswith(LOADER_INFO_VAR) for n in efivars)
    # proxmox-boot-tool writes systemd-boot entries from /etc/kernel/cmdline only on a UEFI
    # boot whose ESPs hold no GRUB; booted by BIOS, or by GRUB (EFI variables there and no
    # LoaderInfo among them), it runs update-grub for each ESP: /etc/default/grub counts
    pbt_grub = not uefi or (bool(efivars) and not sd_booted)
    pbt = _tool(root, "proxmox-boot-tool") if root.exists(PBT_UUIDS) else None
    bls_entries = [e for e in root.listdir("boot/loader/entries") if e.endswith(".conf")]

    if nixos := _nixos(root):
        kind = BootloaderKind.NIXOS
        evidence.append(nixos)
    elif root.exists("run/ostree-booted") or kernel.arg("ostree") is not None:
        kind = BootloaderKind.RPM_OSTREE
        evidence.append("/run/ostree-booted or ostree= on the command line")
    elif pbt and not pbt_grub:
        kind = BootloaderKind.PROXMOX
        evidence.append(f"{pbt} with /etc/kernel/proxmox-boot-uuids")
    elif (ks := _tool(root, "kernelstub")) and root.exists("etc/kernelstub/configuration"):
        kind = BootloaderKind.KERNELSTUB
        evidence.append(f"{ks} with /etc/kernelstub/configuration")
    elif sd_booted:
        kind = BootloaderKind.SYSTEMD_BOOT
        evidence.append("systemd-boot's LoaderInfo EFI variable (it booted this kernel)")
    elif (grubby := _tool(root, "grubby")) and bls_entries:
        kind = BootloaderKind.GRUBBY
        evidence.append(f"{grubby} with {len(bls_entries)} BLS entries in /boot/loader/entries")
    elif root.exists("etc/default/grub") and (
        (ug := _tool(root, "update-grub"))
        or (mk := _tool(root, "grub-mkconfig") or _tool(root, "grub2-mkconfig"))
    ):
        kind = BootloaderKind.GRUB
        grub = read_grub(root)
        evidence += [f"/etc/default/grub with {ug or mk}", grub.why]
        if pbt:
            grub = _proxmox_grub(root, grub, pbt, uefi)
            evidence[-1] = grub.why
    elif uefi and root.exists("etc/kernel/cmdline") and _tool(root, "bootctl"):
        kind = BootloaderKind.SYSTEMD_BOOT
        evidence.append("/etc/kernel/cmdline with bootctl")
    elif _direct_boot(root, kernel):
        evidence.append(DIRECT_BOOT)

    init_evidence: list[str] = []
    init = InitramfsKind.NONE_FOUND
    if tool := _tool(root, "update-initramfs"):
        init = InitramfsKind.INITRAMFS_TOOLS
        init_evidence.append(tool)
    elif tool := _tool(root, "dracut"):
        init = InitramfsKind.DRACUT
        init_evidence.append(tool)
    elif tool := _tool(root, "mkinitcpio"):
        init = InitramfsKind.MKINITCPIO
        init_evidence.append(tool)
    return Boot(
        uefi=uefi,
        bootloader=kind,
        bootloader_evidence=tuple(evidence),
        initramfs=init,
        initramfs_evidence=tuple(init_evidence),
        grub=grub,
    )


# a kernel image's file name in /boot (Debian's vmlinuz-*, Arch's vmlinuz-linux, Gentoo's
# kernel-*, openSUSE's Image-* on arm64, a hand-built bzImage)
_KERNEL_IMAGE = re.compile(r"(vmlinu[xz]|bzImage|kernel|Image)([-.].*)?")


def _direct_boot(root: HostRoot, kernel: Kernel) -> bool:
    """DIRECT_BOOT's test, made only where no boot tool was found: a /boot that is there
    and holds no kernel image, nothing on an ESP, no kernel beside the modules."""
    if not root.isdir("boot") or any(_KERNEL_IMAGE.fullmatch(n) for n in root.listdir("boot")):
        return False
    if root.listdir("boot/efi") or root.listdir("efi"):
        return False
    # Fedora and Arch keep a copy beside the modules; kernel-install takes it from there
    return not (kernel.release and root.exists(f"lib/modules/{kernel.release}/vmlinuz"))


def _nixos(root: HostRoot) -> str | None:
    """NixOS generates /etc (and the boot entries) from configuration.nix: what names it."""
    marks = [
        p
        for p, seen in (
            ("os-release ID=nixos", read_distro(root).id == "nixos"),
            ("/etc/NIXOS", root.exists("etc/NIXOS")),
            ("/run/current-system", root.exists("run/current-system")),
        )
        if seen
    ]
    return " and ".join(marks) if marks and marks[0].startswith("os-release") else None
