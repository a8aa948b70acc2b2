# SPDX-License-Identifier: Apache-2.0
"""systemd-boot with hand-written loader entries and no /etc/kernel/cmdline (Arch's usual
setup, the sample distro ``arch-systemd-boot-entries``): every entry that can boot gets
our arguments, the default one first; undo takes them back from every one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from passthrough.actions import WriteFile
from passthrough.boot import loaderentries
from passthrough.cli import main
from passthrough.host.discover import discover
from passthrough.host.root import HostRoot
from passthrough.plan.build import PlanOptions, make_plan

from .test_apply import changed, snapshot_tree
from .test_plan import build

ENTRIES = "boot/loader/entries"
NAMES = ["arch.conf", "arch-fallback.conf", "arch-lts-fallback.conf", "arch-lts.conf"]
OURS = ["iommu=pt", "vfio-pci.ids=10de:1e87,10de:10f8,10de:1ad8,10de:1ad9"]
EFIVARS = "sys/firmware/efi/efivars"
GUID = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"


def arch(tmp_path: Path) -> Path:
    return build(tmp_path, "turing-desktop", {"distro": "arch-systemd-boot-entries"})


def planned_entries(path: Path) -> list[str]:
    root = HostRoot(str(path))
    plan, _ = make_plan(root, discover(str(path)), PlanOptions())
    return [
        a.path.removeprefix(ENTRIES + "/")
        for a in plan.actions
        if isinstance(a, WriteFile) and "/loader/entries/" in a.path
    ]


def options_of(path: Path, name: str, where: str = ENTRIES) -> list[str]:
    text = (path / where / name).read_text()
    return [w for line in text.splitlines() if line.startswith("options") for w in line.split()[1:]]


def set_efivar(path: Path, name: str, value: str) -> None:
    (path / EFIVARS / f"{name}-{GUID}").write_bytes(
        b"\x07\x00\x00\x00" + (value + "\0").encode("utf-16-le")
    )


def test_every_bootable_entry_is_planned_the_default_first(tmp_path: Path) -> None:
    assert planned_entries(arch(tmp_path)) == NAMES


def test_apply_gives_every_entry_our_arguments_once_and_undo_restores_every_byte(
    tmp_path: Path,
) -> None:
    path = arch(tmp_path)
    before = snapshot_tree(path)
    assert main(["apply", "--root", str(path)]) == 0
    for name in NAMES:
        args = options_of(path, name)
        assert all(args.count(a) == 1 for a in OURS), (name, args)
        assert args[:4] == [
            "root=UUID=7b3c9d1e-4f2a-4b5c-8d6e-9f0a1b2c3d4e",
            "rw",
            "quiet",
            "intel_iommu=on",
        ]
    assert planned_entries(path) == []  # a second plan has nothing left to do
    assert main(["undo", "--root", str(path)]) == 0
    assert changed(before, snapshot_tree(path)) == []


def test_an_admins_edit_to_an_entry_survives_undo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = arch(tmp_path)
    before = snapshot_tree(path)
    assert main(["apply", "--root", str(path)]) == 0
    lts = path / ENTRIES / "arch-lts.conf"
    lts.write_text(lts.read_text().replace(" rw ", " rw nomodeset ") + "sort-key arch\n")
    capsys.readouterr()
    assert main(["undo", "--root", str(path)]) == 0
    assert f"take out what apply added to /{ENTRIES}/arch-lts.conf" in capsys.readouterr().err
    want = before[f"{ENTRIES}/arch-lts.conf"]
    assert isinstance(want, bytes)
    assert lts.read_bytes() == want.replace(b" rw ", b" rw nomodeset ") + b"sort-key arch\n"
    assert changed(before, snapshot_tree(path)) == [f"{ENTRIES}/arch-lts.conf"]


def test_each_entry_gets_what_it_lacks_not_what_the_default_lacks(tmp_path: Path) -> None:
    """The admin wrote the fallback apart: it turns the IOMMU off, which the default entry
    does not. The change is drawn per entry: the fallback's intel_iommu=off becomes =on
    in place, and undo puts it back there."""
    path = arch(tmp_path)
    fallback = path / ENTRIES / "arch-fallback.conf"
    fallback.write_text(fallback.read_text().replace("intel_iommu=on", "intel_iommu=off"))
    before = snapshot_tree(path)
    assert main(["apply", "--root", str(path)]) == 0
    args = options_of(path, "arch-fallback.conf")
    assert "intel_iommu=off" not in args and args.count("intel_iommu=on") == 1
    assert "intel_iommu=on" in "".join(plan_args(before))  # the default had it all along
    assert main(["undo", "--root", str(path)]) == 0
    assert changed(before, snapshot_tree(path)) == []


def plan_args(tree: dict[str, bytes | str]) -> list[str]:
    """The default entry's options as they were (the fallback's word is not in them)."""
    text = tree[f"{ENTRIES}/arch.conf"]
    assert isinstance(text, bytes)
    return [ln for ln in text.decode().splitlines() if ln.startswith("options")]


@pytest.mark.parametrize(
    ("conf", "efivar", "first"),
    [
        ("default arch-lts*\n", None, "arch-lts.conf"),  # a glob: the name sorting last
        ("default arch-fallback\n", None, "arch-fallback.conf"),  # the id without .conf
        ("default arch.conf\n", ("LoaderEntryDefault", "arch-lts.conf"), "arch-lts.conf"),
        ("default @saved\n", ("LoaderEntryLastBooted", "arch-lts-fallback.conf"), None),
        ("timeout 3\n", None, None),  # no default: name order
    ],
)
def test_the_default_entry_comes_first(
    tmp_path: Path, conf: str, efivar: tuple[str, str] | None, first: str | None
) -> None:
    path = arch(tmp_path)
    (path / "boot/loader/loader.conf").write_text(conf)
    if efivar is not None:
        set_efivar(path, *efivar)
    got = planned_entries(path)
    if first is None and efivar is not None:
        first = efivar[1]
    want = [first] if first else []
    assert got == want + sorted(n for n in NAMES if n not in want)


def test_an_entry_whose_kernel_is_not_installed_is_left_and_named(tmp_path: Path) -> None:
    path = arch(tmp_path)
    (path / ENTRIES / "arch-zen.conf").write_text(
        "title Arch Linux (linux-zen)\nlinux /vmlinuz-linux-zen\noptions root=/dev/sda2 rw\n"
    )
    (path / ENTRIES / "windows.conf").write_text("title Windows\nefi /EFI/Microsoft/boot.efi\n")
    root = HostRoot(str(path))
    plan, _ = make_plan(root, discover(str(path)), PlanOptions())
    written = {a.path for a in plan.actions if isinstance(a, WriteFile)}
    assert f"{ENTRIES}/arch-zen.conf" not in written and f"{ENTRIES}/windows.conf" not in written
    assert (
        f"/{ENTRIES}/arch-zen.conf: its kernel /vmlinuz-linux-zen is not on the partition; "
        "left unchanged" in plan.notes
    )


def test_several_options_lines_ours_on_one_and_undo_takes_them_back(tmp_path: Path) -> None:
    path = arch(tmp_path)
    entry = path / ENTRIES / "arch.conf"
    text = entry.read_text().replace("options root=", "options quiet\noptions root=")
    entry.write_text(text.replace(" rw quiet", " rw vfio-pci.ids=10de:0001"))
    before = snapshot_tree(path)
    assert main(["apply", "--root", str(path)]) == 0
    lines = [ln for ln in entry.read_text().splitlines() if ln.startswith("options")]
    assert lines[0] == "options quiet"
    words = [w for ln in lines for w in ln.split()[1:]]
    # one vfio-pci.ids= is read: ours carries the admin's ID too, on the line ours go on
    assert words.count("iommu=pt") == 1 and words.count(OURS[1] + ",10de:0001") == 1
    assert OURS[1] + ",10de:0001" in lines[1] and "vfio-pci.ids=10de:0001" not in words
    assert main(["undo", "--root", str(path)]) == 0
    assert changed(before, snapshot_tree(path)) == []


def test_an_esp_at_efi_is_read_there(tmp_path: Path) -> None:
    path = arch(tmp_path)
    (path / "efi").mkdir()  # the ESP at /efi: the entries and the kernels they load
    (path / "boot/loader").rename(path / "efi/loader")
    for kernel in path.glob("boot/vmlinuz-*"):
        (path / "efi" / kernel.name).write_bytes(b"")
    root = HostRoot(str(path))
    got = [e.path for e in loaderentries.bootable(root)]
    assert got == [f"efi/loader/entries/{n}" for n in NAMES]
    assert main(["apply", "--root", str(path)]) == 0
    assert all(set(OURS) <= set(options_of(path, n, "efi/loader/entries")) for n in NAMES)


def test_no_installed_kernel_refuses_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = arch(tmp_path)
    for kernel in path.glob("boot/vmlinuz-*"):
        kernel.unlink()
    before = snapshot_tree(path)
    capsys.readouterr()
    assert main(["apply", "--root", str(path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "no loader entry whose `linux` kernel is installed" in line
    assert changed(before, snapshot_tree(path)) == []


# -- after a kernel update: entries our journal does not know -----------------------------


def kernel_update(path: Path) -> tuple[str, str]:
    """linux-zen installed after apply: its entry copied from the running command line
    (ours in it), its fallback from a template (ours not). Returns both texts."""
    (path / "boot/vmlinuz-linux-zen").write_bytes(b"")
    running = [ln for ln in (path / ENTRIES / "arch.conf").read_text().splitlines()][-1]
    assert running.startswith("options ") and OURS[1] in running
    copied = f"title Arch Linux (linux-zen)\nlinux /vmlinuz-linux-zen\n{running} nowatchdog\n"
    template = "title Arch Linux (linux-zen, fallback)\nlinux /vmlinuz-linux-zen\noptions rw\n"
    (path / ENTRIES / "arch-zen.conf").write_text(copied)
    (path / ENTRIES / "arch-zen-fallback.conf").write_text(template)
    return copied, template


def new_entries(path: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    capsys.readouterr()
    assert main(["status", "--root", str(path), "--json"]) == 0
    got: list[dict[str, object]] = json.loads(capsys.readouterr().out)["new_entries"]
    return got


def assert_undone(path: Path, before: dict[str, bytes | str], copied: str, template: str) -> None:
    """After undo: the template entry as the kernel update wrote it, ours out of the copy
    (its nowatchdog stays), everything else as it was before apply."""
    assert (path / ENTRIES / "arch-zen-fallback.conf").read_text() == template
    zen = (path / ENTRIES / "arch-zen.conf").read_text()
    assert zen == copied.replace(" " + " ".join(OURS), "")
    new = [f"{ENTRIES}/arch-zen-fallback.conf", f"{ENTRIES}/arch-zen.conf"]
    assert changed(before, snapshot_tree(path)) == sorted([*new, "boot/vmlinuz-linux-zen"])


def test_status_names_entries_a_kernel_update_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = arch(tmp_path)
    assert main(["apply", "--root", str(path)]) == 0
    kernel_update(path)
    assert new_entries(path, capsys) == [
        {"path": f"/{ENTRIES}/arch-zen-fallback.conf", "carries": [], "lacks": OURS},
        {"path": f"/{ENTRIES}/arch-zen.conf", "carries": OURS, "lacks": []},
    ]
    assert main(["status", "--root", str(path)]) == 0
    text = capsys.readouterr().out
    assert f"Loader entry /{ENTRIES}/arch-zen.conf carries our {' '.join(OURS)}" in text
    assert f"Loader entry /{ENTRIES}/arch-zen-fallback.conf lacks {' '.join(OURS)}" in text


def test_undo_takes_our_words_out_of_an_entry_a_kernel_update_copied(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = arch(tmp_path)
    before = snapshot_tree(path)
    assert main(["apply", "--root", str(path)]) == 0
    copied, template = kernel_update(path)
    capsys.readouterr()
    assert main(["undo", "--root", str(path)]) == 0
    err = capsys.readouterr().err
    assert f"take out {' '.join(OURS)} from /{ENTRIES}/arch-zen.conf" in err
    assert_undone(path, before, copied, template)
    assert new_entries(path, capsys) == []


def test_apply_after_a_kernel_update_gives_the_new_entry_ours_and_undo_takes_all_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = arch(tmp_path)
    before = snapshot_tree(path)
    assert main(["apply", "--root", str(path)]) == 0
    copied, template = kernel_update(path)
    assert planned_entries(path) == ["arch-zen-fallback.conf"]  # the copy has them already
    assert main(["apply", "--root", str(path)]) == 0
    assert set(OURS) <= set(options_of(path, "arch-zen-fallback.conf"))
    assert new_entries(path, capsys) == [
        {"path": f"/{ENTRIES}/arch-zen.conf", "carries": OURS, "lacks": []}
    ]
    assert main(["undo", "--root", str(path)]) == 0
    # the template entry back byte for byte (journaled by the second apply)
    assert_undone(path, before, copied, template)
