# SPDX-License-Identifier: Apache-2.0
"""Undo takes out only our words (journal/takeback.py): an admin's edit to a file apply
edited in place survives undo where it does not touch our words; where it does, undo
stops and names the file, as for any drift.

The merge itself on minimal texts (a GRUB default file, /etc/kernel/cmdline, a loader
entry, a modprobe file), then end to end through the CLI on sample-host trees.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from passthrough.boot.linefiles import cmdline_arg_line, edit_lines
from passthrough.cli import main
from passthrough.journal.drift import Ambiguous, Unpicked
from passthrough.journal.takeback import merge, take_back
from passthrough.kargs import ArgChange

from .conftest import tree_hash
from .test_apply import changed, snapshot_tree
from .test_kargs import ARG, changes
from .test_plan import build
from .test_undo_drift import _cmdline

GRUB = "etc/default/grub"
CMDLINE = "etc/kernel/cmdline"
ENTRY = "boot/loader/entries/abc-6.8.12-4-pve.conf"
MODPROBE = "etc/modprobe.d/local.conf"


# -- the merge on minimal files ----------------------------------------------------------

GRUB_BEFORE = 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=off splash"\n'
GRUB_APPLIED = 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n'
GRUB_CASE = (GRUB, GRUB_BEFORE, GRUB_APPLIED)
CMD_BEFORE = "# root first\nroot=/dev/sda1 ro quiet\n"
CMD_APPLIED = "# root first\nroot=/dev/sda1 ro quiet iommu=pt vfio-pci.ids=10de:2504\n"
CMD_CASE = (CMDLINE, CMD_BEFORE, CMD_APPLIED)
ENTRY_BEFORE = "title Proxmox\noptions root=/dev/mapper/pve-root ro quiet\nlinux /abc/vmlinuz\n"
ENTRY_APPLIED = ENTRY_BEFORE.replace("quiet", "quiet iommu=pt")
ENTRY_CASE = (ENTRY, ENTRY_BEFORE, ENTRY_APPLIED)
MOD_BEFORE = "options snd_hda_intel power_save=0\n"
MOD_APPLIED = MOD_BEFORE + "softdep nvidia pre: vfio-pci\n"
MOD_CASE = (MODPROBE, MOD_BEFORE, MOD_APPLIED)

# (the file, as it was, as apply left it), what the admin made of it, what undo leaves
KEPT = {
    # GRUB default file: apply removed iommu=off; it goes back where it was
    "grub-word-at-end": (
        GRUB_CASE,
        'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet splash nomodeset"\n',
        'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=off splash nomodeset"\n',
    ),
    "grub-word-in-front-and-a-line": (
        GRUB_CASE,
        'GRUB_DEFAULT=saved\nGRUB_CMDLINE_LINUX_DEFAULT="nomodeset quiet splash"\n',
        'GRUB_DEFAULT=saved\nGRUB_CMDLINE_LINUX_DEFAULT="nomodeset quiet iommu=off splash"\n',
    ),
    "cmdline-word-after-ours": (
        CMD_CASE,
        CMD_APPLIED.replace("2504", "2504 nomodeset"),
        "# root first\nroot=/dev/sda1 ro quiet nomodeset\n",
    ),
    "cmdline-word-before-ours-and-a-comment": (
        CMD_CASE,
        "# root first\n# mine\nroot=/dev/sda1 ro quiet splash iommu=pt vfio-pci.ids=10de:2504\n",
        "# root first\n# mine\nroot=/dev/sda1 ro quiet splash\n",
    ),
    "loader-entry-options-and-title": (
        ENTRY_CASE,
        ENTRY_APPLIED.replace("ro quiet", "ro nomodeset quiet").replace("Proxmox", "PVE"),
        ENTRY_BEFORE.replace("ro quiet", "ro nomodeset quiet").replace("Proxmox", "PVE"),
    ),
    "modprobe-line-before": (
        MOD_CASE,
        "blacklist pcspkr\n" + MOD_APPLIED,
        "blacklist pcspkr\n" + MOD_BEFORE,
    ),
    "modprobe-line-after": (
        MOD_CASE,
        MOD_APPLIED + "options kvm ignore_msrs=1\n",
        MOD_BEFORE + "options kvm ignore_msrs=1\n",
    ),
    # mkinitcpio: apply filled MODULES=(); the admin added a module of theirs
    "mkinitcpio-array": (
        (
            "etc/mkinitcpio.conf",
            "MODULES=()\nHOOKS=(base)\n",
            "MODULES=(vfio_pci vfio)\nHOOKS=(base)\n",
        ),
        "MODULES=(vfio_pci vfio nvme)  # disk\nHOOKS=(base udev)\n",
        "MODULES=(nvme)  # disk\nHOOKS=(base udev)\n",
    ),
    "grub-single-quotes-and-export": (
        (GRUB, "export GRUB_CMDLINE_LINUX='a b'\n", "export GRUB_CMDLINE_LINUX='a'\n"),
        "export GRUB_CMDLINE_LINUX='c a'\n",
        "export GRUB_CMDLINE_LINUX='c a b'\n",
    ),
    "grub-unquoted-one-word": (
        (GRUB, "GRUB_CMDLINE_LINUX=iommu=off\n", "GRUB_CMDLINE_LINUX=\n"),
        "GRUB_CMDLINE_LINUX= # none\n",
        "GRUB_CMDLINE_LINUX=iommu=off # none\n",
    ),
    "modprobe-made-by-apply": ((MODPROBE, "", "ours\n"), "ours\nmine\n", "mine\n"),
    "modprobe-made-by-apply-emptied": ((MODPROBE, "", "ours\n"), "", None),
}

REFUSED = {
    # between quiet and splash, where iommu=off returns: which goes first cannot be told
    "grub-word-where-ours-returns": (
        GRUB_CASE,
        'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet nomodeset splash"\n',
    ),
    # no longer a plain list of words
    "grub-command-substitution": (
        GRUB_CASE,
        'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet splash $(cat /x)"\n',
    ),
    "grub-second-command": (
        GRUB_CASE,
        'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet splash" ; echo\n',
    ),
    # unquoted, a second word would be a command: only a quoted value holds more words
    "grub-unquoted-two-words": (
        (GRUB, "GRUB_CMDLINE_LINUX=iommu=off\n", "GRUB_CMDLINE_LINUX=\n"),
        "GRUB_CMDLINE_LINUX=quiet\n",
    ),
    "cmdline-our-word-changed": (CMD_CASE, CMD_APPLIED.replace("2504", "2505")),
    "cmdline-our-word-removed": (CMD_CASE, CMD_APPLIED.replace(" iommu=pt", "")),
    "cmdline-line-removed": (CMD_CASE, "# root first\n"),
    # the same words outside loader/entries are no list of words: a line, changed whole
    "options-outside-loader-entries": (
        ("etc/other.conf", ENTRY_BEFORE, ENTRY_APPLIED),
        ENTRY_APPLIED.replace("ro quiet", "ro nomodeset quiet"),
    ),
    "modprobe-our-line-changed": (MOD_CASE, MOD_APPLIED.replace("nvidia", "nouveau")),
}


@pytest.mark.parametrize("case", sorted(KEPT))
def test_the_admins_edit_is_kept_and_ours_taken_out(case: str) -> None:
    (path, original, written), admin, want = KEPT[case]
    got = take_back(path, original.encode(), written.encode(), admin.encode())
    assert isinstance(got, Unpicked), got
    assert got.content == (None if want is None else want.encode())


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_an_edit_that_touches_our_words_is_refused(case: str) -> None:
    (path, original, written), admin = REFUSED[case]
    got = take_back(path, original.encode(), written.encode(), admin.encode())
    assert isinstance(got, Ambiguous)


def test_merge_of_plain_sequences() -> None:
    assert merge("abc", "ac", "abcd") == list("acd")
    assert merge("abc", "abxc", "abc") == list("abxc")
    assert merge("abc", "ac", "ac") == list("ac")  # the same change on both sides, once
    assert merge("abc", "ac", "aXc") is None  # both changed b
    assert merge("abc", "abxc", "abyc") is None  # both inserted at one place


# -- end to end --------------------------------------------------------------------------


def pve(tmp_path: Path, entry: bool = False) -> Path:
    """acs-override-proxmox: apply appends to /etc/kernel/cmdline; with ``entry``, no such
    file but a loader entry, whose options line apply appends to."""
    path = build(tmp_path, "acs-override-proxmox", {})
    if entry:
        (path / CMDLINE).unlink()
        (path / ENTRY).parent.mkdir(parents=True)
        (path / ENTRY).write_text(ENTRY_BEFORE)
        # the entry's kernel is installed: an entry that cannot boot is left alone
        (path / "boot/abc").mkdir()
        (path / "boot/abc/vmlinuz").write_bytes(b"")
    return path


@pytest.mark.parametrize(("entry", "rel"), [(False, CMDLINE), (True, ENTRY)])
def test_undo_after_an_admins_word_keeps_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], entry: bool, rel: str
) -> None:
    path = pve(tmp_path, entry)
    before = snapshot_tree(path)
    original = (path / rel).read_text()
    assert main(["apply", "--root", str(path)]) == 0
    applied = (path / rel).read_text()
    assert "vfio-pci.ids=" in applied
    # the admin puts a word of theirs right after ours, and a line of theirs before it
    edited = applied.replace("vfio-pci.ids=10de:2504,10de:228e", "$& nomodeset")
    edited = edited.replace("$&", "vfio-pci.ids=10de:2504,10de:228e")
    (path / rel).write_text("# the admin's\n" + edited)
    capsys.readouterr()
    assert main(["undo", "--root", str(path)]) == 0
    assert f"take out what apply added to /{rel}" in capsys.readouterr().err
    want = original.replace(" quiet", " quiet nomodeset", 1) if entry else None
    if want is None:  # /etc/kernel/cmdline: ours was last on the line
        want = original.rstrip("\n") + " nomodeset\n"
    assert (path / rel).read_text() == "# the admin's\n" + want
    assert changed(before, snapshot_tree(path)) == [rel]


def test_undo_after_an_edit_of_our_word_refuses_and_names_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = pve(tmp_path)
    assert main(["apply", "--root", str(path)]) == 0
    cmdline = path / CMDLINE
    cmdline.write_text(cmdline.read_text().replace("10de:2504,10de:228e", "10de:2504"))
    frozen = tree_hash(path)
    capsys.readouterr()
    assert main(["undo", "--root", str(path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"/{CMDLINE} (changed since apply where apply changed it)" in line
    assert "--force" in line
    assert tree_hash(path) == frozen


def test_undo_after_an_admins_word_in_etc_default_grub(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """apply removes amd_iommu=on where it was written in /etc/default/grub; an admin then
    adds a word to that line and changes another: undo puts amd_iommu=on back where it
    was and keeps both, as a real sh sources the file."""
    path = build(tmp_path, "amd-b550-chipset", {})
    grub = path / GRUB
    grub.write_text(grub.read_text().replace('DEFAULT="', 'DEFAULT="amd_iommu=on '))
    before = snapshot_tree(path)
    argv = ["--root", str(path), "--gpu", "0000:2d:00.0", "--allow-boot-gpu"]
    assert main(["apply", *argv]) == 0
    assert 'DEFAULT="quiet splash iommu=pt"' in grub.read_text()
    edited = grub.read_text().replace("iommu=pt", "iommu=pt nomodeset")
    grub.write_text(edited.replace("GRUB_TIMEOUT=5", "GRUB_TIMEOUT=1"))
    capsys.readouterr()
    assert main(["undo", "--root", str(path)]) == 0
    assert f"take out what apply added to /{GRUB}" in capsys.readouterr().err
    want = before[GRUB].decode().replace("iommu=pt", "iommu=pt nomodeset")
    assert grub.read_text() == want.replace("GRUB_TIMEOUT=5", "GRUB_TIMEOUT=1")
    assert changed(before, snapshot_tree(path)) == [GRUB]
    assert _cmdline(path) == "amd_iommu=on quiet splash iommu=pt nomodeset"


# -- properties: against the planner's own edit (boot/linefiles.py) ----------------------

ADMIN = "zz_admin.word=1"  # a word no change draws


def cmdline_case(args: list[str], change: ArgChange) -> tuple[str, str, list[str]]:
    original = "# kernel-install reads the lines that are not comments\n" + " ".join(args) + "\n"
    written = edit_lines(original, change, cmdline_arg_line, "")
    return original, written, written.split("\n")


@settings(max_examples=300)
@given(st.lists(ARG, min_size=1, max_size=10), changes())
def test_a_file_nobody_touched_comes_back_byte_for_byte(args: list[str], change: ArgChange) -> None:
    original, written, _lines = cmdline_case(args, change)
    got = take_back(CMDLINE, original.encode(), written.encode(), written.encode())
    assert got == Unpicked(original.encode())


@settings(max_examples=300)
@given(st.lists(ARG, min_size=1, max_size=10), changes())
def test_a_word_added_at_the_end_is_kept_and_ours_go(args: list[str], change: ArgChange) -> None:
    """Where apply only appended, always taken apart. Otherwise taken apart exactly, or
    refused in the one collision there is: apply removed the line's last word, which
    goes back at the very end, where the admin's word went too."""
    original, written, lines = cmdline_case(args, change)
    lines[1] += " " + ADMIN
    got = take_back(CMDLINE, original.encode(), written.encode(), "\n".join(lines).encode())
    comment, line, _ = original.split("\n")
    want = f"{comment}\n{line} {ADMIN}\n".encode()
    if isinstance(got, Ambiguous):
        assert args[-1] not in written.split(), (written, got)
    else:
        assert got == Unpicked(want)
    appended_only = lines[1].split()[: len(args)] == args
    assert got == Unpicked(want) or not appended_only
