# SPDX-License-Identifier: Apache-2.0
"""What the next boot gets, checked after apply's regeneration and before "reboot"
(journal/nextboot.py).

The sample trees are made runnable through chroot with this machine's real ``dash`` and
``env`` (and the libraries they load). GRUB's own ``grub-mkconfig`` cannot run here
(``grub-probe`` finds no device for / in this container: it exits 1), so ``update-grub``
in the tree is a **stand-in**: a real shell script that sources the GRUB files with the
real dash and writes grub.cfg's first ``menuentry`` from them. The initramfs listings
come from this machine's real ``lsinitramfs`` (initramfs-tools-core) on images made by the
real ``cpio``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from passthrough.actions import PlanRecord
from passthrough.boot import grub, readback
from passthrough.cli import main
from passthrough.host.root import HostRoot
from passthrough.journal import nextboot
from passthrough.model import InitramfsKind

from .test_apply import snapshot_tree
from .test_plan import build

# (the sample's /etc/default/grub has iommu=pt already: only the IDs are ours to add)
OURS = "vfio-pci.ids=10de:2684,10de:22ba"
MODPROBE = "etc/modprobe.d/passthrough-vfio.conf"
VFIO_KO = "usr/lib/modules/6.1.0-27-amd64/kernel/drivers/vfio/pci/vfio-pci.ko"

# update-grub stand-ins (see the module's docstring): one reads /etc/default/grub only, as
# upstream grub-mkconfig does; the other reads the grub.d drop-ins after it, as Debian's
MKCONFIG = """#!/bin/sh
. /etc/default/grub
{dropins}
printf 'menuentry "Debian GNU/Linux" {{\\n\\tlinux\\t/boot/vmlinuz-6.1.0-27-amd64 root=/dev/vda ro %s %s\\n}}\\n' \\
    "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT" > /boot/grub/grub.cfg
"""
UPSTREAM = MKCONFIG.format(dropins="")
DEBIAN = MKCONFIG.format(dropins='for f in /etc/default/grub.d/*.cfg; do . "$f"; done')


def _libraries(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    return re.findall(r"(/\S+\.so[.\d]*)", out)


def runnable(tree: Path) -> None:
    """This machine's dash (as /bin/sh) and env with their libraries, so that apply runs
    commands in the tree through chroot (a full OS tree to command_mode)."""
    assert os.geteuid() == 0, "chroot and mounts: run as root (CI does)"
    for src, dest in (("/usr/bin/dash", "bin/sh"), ("/usr/bin/env", "usr/bin/env")):
        for lib in _libraries(src):
            (tree / lib.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(lib, tree / lib.lstrip("/"))
        (tree / dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, tree / dest)
    (tree / "dev").mkdir(exist_ok=True)


def grub_host(tmp_path: Path, mkconfig: str) -> Path:
    path = build(tmp_path, "consumer-intel", {})
    runnable(path)
    (path / "usr/sbin/update-grub").write_text(mkconfig)
    return path


# -- GRUB: grub.cfg's default entry, after a real regeneration in the root -----------------


@pytest.mark.root
def test_a_grub_cfg_without_our_arguments_stops_before_reboot_and_undo_restores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = grub_host(tmp_path, UPSTREAM)
    before = snapshot_tree(path)
    capsys.readouterr()
    assert main(["apply", "--root", str(path)]) == 5
    out, err = capsys.readouterr()
    assert "Reboot" not in out
    (line,) = err.strip().splitlines()[-1:]
    assert line.startswith(
        "passthrough: error: apply is done, but the next boot would not get it: "
    )
    assert f"/boot/grub/grub.cfg (first menuentry, 'Debian GNU/Linux'): {OURS}" in line
    assert "`passthrough undo` puts everything back" in line
    assert (
        "linux\t/boot/vmlinuz-6.1.0-27-amd64 root=/dev/vda ro  quiet"
        in (path / "boot/grub/grub.cfg").read_text()
    )  # the stand-in really ran, through chroot
    assert main(["undo", "--root", str(path)]) == 0
    after = snapshot_tree(path)
    assert {k: v for k, v in after.items() if k.startswith("etc/")} == {
        k: v for k, v in before.items() if k.startswith("etc/")
    }


@pytest.mark.root
def test_apply_again_after_exit_5_is_exit_5_again_not_nothing_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 5 says the next boot lacks it; the same apply run again changes no file, and
    must not read as done while grub.cfg still lacks our arguments. Once the boot tool
    reads our file (the admin fixes it), the same no-op run checks, and says reboot."""
    path = grub_host(tmp_path, UPSTREAM)
    capsys.readouterr()
    assert main(["apply", "--root", str(path)]) == 5
    capsys.readouterr()
    assert main(["apply", "--root", str(path)]) == 5
    out, err = capsys.readouterr()
    assert out.startswith("Nothing to do: the host already matches the plan.")
    assert "Reboot" not in out and "No reboot" not in out
    assert f"(first menuentry, 'Debian GNU/Linux'): {OURS}" in err.strip().splitlines()[-1]
    assert main(["apply", "--root", str(path), "--json"]) == 5
    got = json.loads(capsys.readouterr().out)
    assert got["changed"] is False and got["next_boot"]["missing"]
    (path / "usr/sbin/update-grub").write_text(DEBIAN)
    subprocess.run(["chroot", str(path), "/bin/sh", "/usr/sbin/update-grub"], check=True)
    assert main(["apply", "--root", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        "Nothing to do" in out and "Checked what the next boot reads: /boot/grub/grub.cfg." in out
    )
    # the sample's /proc/cmdline is the kernel running: it has not booted with the IDs
    assert out.rstrip().endswith("reboot, then run `passthrough verify`.")


@pytest.mark.root
def test_a_regeneration_that_failed_then_ran_still_says_reboot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """update-grub failed (exit 3), the admin fixed it, apply again ran only the owed
    regeneration: what the boot reads changed, so a reboot is due (it said "No reboot
    required" before)."""
    path = grub_host(tmp_path, "#!/bin/sh\nexit 1\n")
    capsys.readouterr()
    assert main(["apply", "--root", str(path)]) == 3
    capsys.readouterr()
    (path / "usr/sbin/update-grub").write_text(DEBIAN)
    assert main(["apply", "--root", str(path), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [s["argv"] for s in got["steps"]] == [["update-grub"]]
    assert got["reboot_required"] is True
    assert main(["apply", "--root", str(path)]) == 0  # and once more: nothing left to run
    out = capsys.readouterr().out
    assert "Nothing to do" in out and "reboot, then run `passthrough verify`." in out
    # a host whose running kernel has the arguments (it rebooted): no reboot owed
    cmdline = path / "proc/cmdline"
    cmdline.write_text(cmdline.read_text().strip() + f" {OURS}\n")
    assert main(["apply", "--root", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reboot_required"] is False


@pytest.mark.root
def test_the_fleets_task_runs_an_owed_regeneration_and_asks_for_the_reboot(
    tmp_path: Path,
) -> None:
    """The host role's task (passthrough.hosttask.run, what the module and the direct
    command both run) after an apply whose update-grub failed: the files are ours, so the
    plan is empty, and it said "ok, no reboot" while grub.cfg never got our arguments. Now
    it reports the owed command (check mode), runs it, asks for the reboot, then is a no-op."""
    from passthrough.errors import PassthroughError
    from passthrough.hosttask import run as task

    path = grub_host(tmp_path, "#!/bin/sh\nexit 1\n")
    params = {"root": str(path), "state": "present", "preflight": []}
    with pytest.raises(PassthroughError) as failed:
        task(params, check_mode=False)
    assert failed.value.exit_code == 3
    (path / "usr/sbin/update-grub").write_text(DEBIAN)
    checked = task(params, check_mode=True)
    assert checked["plan"]["actions"] == [] and checked["pending"] == [["update-grub"]]
    assert checked["changed"] is True and checked["reboot_required"] is True
    assert OURS not in (path / "boot/grub/grub.cfg").read_text()  # check mode ran nothing
    done = task(params, check_mode=False)
    assert done["changed"] is True and done["reboot_required"] is True and done["transaction"]
    assert OURS in (path / "boot/grub/grub.cfg").read_text()
    again = task(params, check_mode=False)
    assert (again["changed"], again["reboot_required"], again["pending"]) == (False, False, [])


@pytest.mark.root
def test_a_grub_cfg_with_our_arguments_is_checked_then_reboot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = grub_host(tmp_path, DEBIAN)
    capsys.readouterr()
    assert main(["apply", "--root", str(path), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["next_boot"]
    assert got["checked"] == ["/boot/grub/grub.cfg"] and got["missing"] == []
    assert got["not_run"] == []
    # the sample has no initramfs image: named, not a failure
    assert got["unchecked"] == ["the initramfs (no /boot/initrd.img-*)"]
    assert OURS in (path / "boot/grub/grub.cfg").read_text()


def test_commands_only_listed_are_not_checked_and_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tree that is not a full OS: update-grub is listed, so nothing is read."""
    path = build(tmp_path, "consumer-intel", {})
    capsys.readouterr()
    assert main(["apply", "--root", str(path)]) == 0
    out = capsys.readouterr().out
    assert "What the next boot gets is not checked: the commands below did not run here." in out
    # the listed commands come first, inside the root; only then the reboot
    tail = out.split("run them inside the root first:\n", 1)[1].splitlines()
    assert [line.startswith("  ") for line in tail] == [True] * (len(tail) - 1) + [False]
    assert tail[-1] == "Then reboot, and run `passthrough verify`."
    assert "Reboot, then" not in out


def test_a_grub_cfg_of_bls_entries_is_named_not_checked(tmp_path: Path) -> None:
    path = build(tmp_path, "consumer-intel", {})
    (path / "boot/grub/grub.cfg").write_text("set default=0\ninsmod blscfg\nblscfg\n")
    record = PlanRecord.from_json({"kernel_args": {"set": ["iommu=pt"]}, "bootloader": "grub"})
    out = readback.NextBoot()
    grub.check_grub(HostRoot(str(path)), record, out)
    assert out.missing == [] and out.checked == []
    assert out.unchecked == [
        "/boot/grub/grub.cfg (could not tell which entry boots: it has no menuentry)"
    ]


def test_lacking_counts_the_last_value_and_dropped_keys() -> None:
    record = PlanRecord.from_json(
        {"kernel_args": {"set": ["iommu=pt", "intel_iommu=on"], "remove": ["amd_iommu"]}}
    )
    assert readback.lacking(["iommu=pt", "intel_iommu=on"], record) == []
    assert readback.lacking(["intel_iommu=on", "iommu=pt", "iommu=off"], record) == ["iommu=pt"]
    assert readback.lacking(["iommu=pt", "intel_iommu=on", "amd_iommu=on"], record) == [
        "(not amd_iommu)"
    ]


# -- the initramfs: this machine's lsinitramfs on images made by cpio ----------------------


def image(tmp_path: Path, name: str, members: list[str]) -> Path:
    """A real initramfs (a newc cpio archive, gzip-compressed) holding ``members``."""
    src = tmp_path / f"{name}.d"
    for member in members:
        (src / member).parent.mkdir(parents=True, exist_ok=True)
        (src / member).write_text("x\n")
    names = "\n".join(str(p.relative_to(src)) for p in sorted(src.rglob("*"))) + "\n"
    archive = subprocess.run(
        ["cpio", "--quiet", "-o", "-H", "newc"],
        input=names.encode(),
        cwd=src,
        capture_output=True,
        check=True,
    ).stdout
    out = tmp_path / name
    # compressed, as mkinitramfs writes it (COMPRESS=gzip): lsinitramfs reads an
    # uncompressed first archive as the early microcode one and looks for more
    out.write_bytes(
        subprocess.run(["gzip", "-c"], input=archive, capture_output=True, check=True).stdout
    )
    return out


def lsinitramfs(path: Path) -> str:
    assert shutil.which("lsinitramfs"), "lsinitramfs: scripts/setup.sh test installs it"
    return subprocess.run(
        ["lsinitramfs", str(path)], capture_output=True, text=True, check=True
    ).stdout


@pytest.mark.parametrize(
    ("members", "lacks"),
    [
        ([VFIO_KO, MODPROBE], []),
        (
            [MODPROBE, "usr/lib/modules/6.1.0-27-amd64/kernel/drivers/vfio/vfio.ko"],
            ["vfio-pci module"],
        ),
        ([VFIO_KO, "etc/modprobe.d/other.conf"], ["/" + MODPROBE]),
    ],
)
def test_a_real_lsinitramfs_listing_says_what_the_image_lacks(
    tmp_path: Path, members: list[str], lacks: list[str]
) -> None:
    listing = lsinitramfs(image(tmp_path, "initrd.img", members))
    paths = nextboot.listed_paths(listing)
    assert set(members) <= set(paths)
    assert nextboot.image_lacks(paths, modprobe=True) == lacks


def test_check_initramfs_lists_every_image_with_the_roots_tool(tmp_path: Path) -> None:
    """Each image under /boot is listed and judged; the listing tool is this machine's
    lsinitramfs, run on the tree's image (a redirect: the sample tree has no
    initramfs-tools of its own to chroot into)."""
    path = build(tmp_path, "consumer-intel", {})
    (path / MODPROBE).write_text("options vfio-pci ids=10de:2684\n")
    good = image(tmp_path, "good", [VFIO_KO, MODPROBE])
    bad = image(tmp_path, "bad", [MODPROBE])
    shutil.copy(good, path / "boot/initrd.img-6.1.0-27-amd64")
    shutil.copy(bad, path / "boot/initrd.img-6.1.0-26-amd64")
    asked: list[list[str]] = []

    def this_machines_lsinitramfs(argv: list[str]) -> subprocess.CompletedProcess[str]:
        asked.append(argv[-2:])
        return subprocess.run(
            ["lsinitramfs", str(path) + argv[-1]], capture_output=True, text=True, check=False
        )

    out = readback.NextBoot()
    nextboot.check_initramfs(
        HostRoot(str(path)), InitramfsKind.INITRAMFS_TOOLS, this_machines_lsinitramfs, out
    )
    assert sorted(asked) == [
        ["lsinitramfs", "/boot/initrd.img-6.1.0-26-amd64"],
        ["lsinitramfs", "/boot/initrd.img-6.1.0-27-amd64"],
    ]
    assert out.missing == ["/boot/initrd.img-6.1.0-26-amd64: vfio-pci module"]
    assert len(out.checked) == 2 and out.unchecked == []


# -- systemd-boot: the loader entries, after kernel-install or our own edit ----------------

# a kernel-install stand-in that takes the running command line, not /etc/kernel/cmdline
# (what kernel-install does where it does not find the file): its entry lacks ours
KERNEL_INSTALL = """#!/bin/sh
read -r running < /proc/cmdline
printf 'title Arch Linux\\nlinux /vmlinuz-linux\\noptions %s\\n' "$running" \\
    > /boot/loader/entries/arch.conf
"""


@pytest.mark.root
def test_a_kernel_install_entry_without_our_arguments_stops_before_reboot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = build(tmp_path, "turing-desktop", {})
    runnable(path)
    (path / "usr/bin/kernel-install").write_text(KERNEL_INSTALL)
    (path / "boot/loader/entries").mkdir(parents=True)
    (path / "boot/vmlinuz-linux").write_bytes(b"")
    capsys.readouterr()
    assert main(["apply", "--root", str(path)]) == 5
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert "/boot/loader/entries/arch.conf: iommu=pt vfio-pci.ids=10de:1e87" in line
    assert line.count("/boot/loader/entries/") == 1 and "`passthrough undo`" in line
    assert main(["undo", "--root", str(path)]) == 0


# what Debian 12's kernel-install writes when the tree's ESP is a plain folder, not a mount
# point: its 90-loaderentry.install names the files from `stat -c %m` of the ESP, here the
# tree's /, so the entry says /boot/efi/... where the loader, reading the ESP, finds nothing
KERNEL_INSTALL_PLAIN_ESP = """#!/bin/sh
read -r line < /etc/kernel/cmdline
: > /boot/efi/debian/$2/linux
printf 'title Debian\\nlinux /boot/efi/debian/%s/linux\\noptions %s\\n' "$2" "$line" \\
    > /boot/efi/loader/entries/debian-$2.conf
"""


@pytest.mark.root
def test_an_entry_whose_kernel_the_loader_cannot_find_stops_before_reboot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """kernel-install in a tree whose ESP is not mounted wrote an entry with our arguments
    but with paths from the tree's /: systemd-boot on the ESP cannot load that kernel. Not
    "reboot": exit 5 naming the entry and where its kernel is not, and undo takes it back."""
    path = build(tmp_path, "turing-desktop", {})
    runnable(path)
    (path / "usr/bin/kernel-install").write_text(KERNEL_INSTALL_PLAIN_ESP)
    # (the tree has a shell and env only: the stand-in's folders are made here)
    (path / "boot/efi/loader/entries").mkdir(parents=True)
    (path / "boot/efi/debian/6.11.5-arch1-1").mkdir(parents=True)
    capsys.readouterr()
    assert main(["apply", "--root", str(path)]) == 5
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    entries = sorted((path / "boot/efi/loader/entries").glob("*.conf"))
    assert entries, "the stand-in wrote no entry"
    for entry in entries:
        assert "iommu=pt" in entry.read_text()  # our arguments are there, the kernel is not
        assert f"/boot/efi/loader/entries/{entry.name}: its kernel /boot/efi/debian/" in line
    assert "is not on the partition at /boot/efi" in line and "`passthrough undo`" in line
    assert main(["undo", "--root", str(path)]) == 0


@pytest.mark.root
def test_hand_written_entries_are_checked_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Arch's entries get our words from apply itself; mkinitcpio (a no-op stand-in) is
    the regeneration that runs. Every entry is read back before "reboot"."""
    path = build(tmp_path, "turing-desktop", {"distro": "arch-systemd-boot-entries"})
    runnable(path)
    capsys.readouterr()
    assert main(["apply", "--root", str(path), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["next_boot"]
    names = ["arch.conf", "arch-fallback.conf", "arch-lts-fallback.conf", "arch-lts.conf"]
    assert got["checked"] == [f"/boot/loader/entries/{n}" for n in names]
    assert got["missing"] == []
    # the tree has no lsinitcpio: each image named as not checked, never a failure
    assert (
        "/boot/initramfs-linux.img (lsinitcpio is not in the root, or failed)" in (got["unchecked"])
    )


def test_a_builtin_vfio_pci_needs_no_module_and_a_rescue_image_is_not_read(
    tmp_path: Path,
) -> None:
    """dracut (Fedora): vfio-pci built into the kernel (modules.builtin names it), so the
    image carries only our modprobe.d file; the rescue image, built once at install and
    never regenerated, is not listed."""
    path = build(tmp_path, "consumer-intel", {})
    (path / MODPROBE).write_text("options vfio-pci ids=10de:2684\n")
    modules = path / "lib/modules/6.1.0-27-amd64"
    modules.mkdir(parents=True, exist_ok=True)
    (modules / "modules.builtin").write_text("kernel/drivers/vfio/pci/vfio-pci.ko\n")
    shutil.copy(image(tmp_path, "img", [MODPROBE]), path / "boot/initramfs-6.1.0-27-amd64.img")
    shutil.copy(
        image(tmp_path, "old", ["etc/initrd-release"]), path / "boot/initramfs-0-rescue-abc.img"
    )
    asked: list[str] = []

    def this_machines_lsinitramfs(argv: list[str]) -> subprocess.CompletedProcess[str]:
        asked.append(argv[-1])  # dracut's lsinitrd is not here: the same listing, by path
        return subprocess.run(
            ["lsinitramfs", str(path) + argv[-1]], capture_output=True, text=True, check=False
        )

    out = readback.NextBoot()
    root = HostRoot(str(path))
    nextboot.check_initramfs(root, InitramfsKind.DRACUT, this_machines_lsinitramfs, out)
    assert asked == ["/boot/initramfs-6.1.0-27-amd64.img"]
    assert out.missing == [] and out.checked == asked
