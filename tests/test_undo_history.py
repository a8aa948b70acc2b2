# SPDX-License-Identifier: Apache-2.0
"""Undo walks each file back through every transaction that changed it, newest first.

An admin's edit made between two applies (or after the last) is merged with the reversal
of each of our steps, or the file is refused and named; it is never reverted by putting
the first apply's backup back. Sample-host trees, through the CLI, as an admin runs it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from passthrough.boot.shellvars import loop_words
from passthrough.cli import main

from .conftest import tree_hash
from .test_apply import changed, snapshot_tree
from .test_plan import build
from .test_undo_drift import _cmdline

CMDLINE = "etc/kernel/cmdline"
DROPIN = "etc/default/grub.d/99-passthrough.cfg"
MODPROBE = "etc/modprobe.d/passthrough-vfio.conf"
IDS = "vfio-pci.ids=10de:2504,10de:228e"


def sdboot(tmp_path: Path) -> Path:
    """acs-override-proxmox (systemd-boot, /etc/kernel/cmdline) with a root by UUID."""
    path = build(tmp_path, "acs-override-proxmox", {})
    (path / CMDLINE).write_text("root=UUID=abcd ro quiet\n")
    return path


def edit(path: Path, rel: str, old: str, new: str) -> None:
    text = (path / rel).read_text()
    assert old in text, (old, text)
    (path / rel).write_text(text.replace(old, new, 1))


def run(*argv: str) -> int:
    return main(list(argv))


def test_an_edit_between_two_applies_survives_undo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case: the root disk moved between two applies; undo kept the old UUID."""
    path = sdboot(tmp_path)
    before = snapshot_tree(path)
    assert run("apply", "--root", str(path)) == 0
    edit(path, CMDLINE, "root=UUID=abcd ro quiet", "root=UUID=ef01 ro quiet nomodeset")
    assert run("apply", "--root", str(path), "--hugepages-1g", "2") == 0
    assert "hugepages=2" in (path / CMDLINE).read_text()
    capsys.readouterr()
    assert run("undo", "--root", str(path)) == 0
    assert f"take out what apply added to /{CMDLINE}" in capsys.readouterr().err
    assert (path / CMDLINE).read_text() == "root=UUID=ef01 ro quiet nomodeset\n"
    assert changed(before, snapshot_tree(path)) == [CMDLINE]


def test_three_applies_with_edits_between_and_after(tmp_path: Path) -> None:
    path = sdboot(tmp_path)
    before = snapshot_tree(path)
    assert run("apply", "--root", str(path)) == 0
    edit(path, CMDLINE, "UUID=abcd", "UUID=ef01")
    assert run("apply", "--root", str(path), "--hugepages-1g", "2") == 0
    edit(path, CMDLINE, "root=", "mitigations=off root=")
    assert run("apply", "--root", str(path), "--hugepages-1g", "4") == 0
    assert "hugepages=4" in (path / CMDLINE).read_text()
    edit(path, CMDLINE, "\n", " nomodeset\n")
    assert run("undo", "--root", str(path)) == 0
    want = "mitigations=off root=UUID=ef01 ro quiet nomodeset\n"
    assert (path / CMDLINE).read_text() == want
    assert changed(before, snapshot_tree(path)) == [CMDLINE]


def test_two_applies_with_nothing_changed_between_give_the_original_bytes(
    tmp_path: Path,
) -> None:
    path = sdboot(tmp_path)
    before = snapshot_tree(path)
    assert run("apply", "--root", str(path)) == 0
    assert run("apply", "--root", str(path), "--hugepages-1g", "2") == 0
    assert run("undo", "--root", str(path)) == 0
    assert changed(before, snapshot_tree(path)) == []


def test_an_edit_of_our_word_between_two_applies_is_refused_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = sdboot(tmp_path)
    assert run("apply", "--root", str(path)) == 0
    edit(path, CMDLINE, IDS, "vfio-pci.ids=10de:2504")
    assert run("apply", "--root", str(path), "--hugepages-1g", "2") == 0
    frozen = tree_hash(path)
    capsys.readouterr()
    assert run("undo", "--root", str(path)) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"/{CMDLINE} (changed since apply where apply changed it)" in line
    assert tree_hash(path) == frozen


def test_an_edit_of_our_grub_dropin_between_two_applies_is_kept(tmp_path: Path) -> None:
    """apply rewrites its whole drop-in; the admin replaces our appending line by an
    assignment with a word of theirs between two applies: that is what undo leaves (a file of theirs now), and the GRUB files source to the original
    arguments plus theirs."""
    path = build(tmp_path, "consumer-intel", {})
    before = snapshot_tree(path)
    original = _cmdline(path)
    assert run("apply", "--root", str(path)) == 0
    *header, line = (path / DROPIN).read_text().rstrip("\n").split("\n")
    ours = loop_words(line)
    assert ours is not None, line
    admin = f'{ours[0]}="${{{ours[0]}}} {" ".join(ours[1])} nomodeset"'
    (path / DROPIN).write_text("\n".join([*header, admin]) + "\n")
    assert run("apply", "--root", str(path), "--hugepages-1g", "2") == 0
    assert run("undo", "--root", str(path)) == 0
    text = (path / DROPIN).read_text()
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT} nomodeset"' in text
    assert _cmdline(path).split() == [*original.split(), "nomodeset"]
    assert changed(before, snapshot_tree(path)) == [DROPIN]


def test_an_edit_of_our_modprobe_file_between_two_applies_is_kept(tmp_path: Path) -> None:
    path = build(tmp_path, "hgx-h100", {})
    before = snapshot_tree(path)
    assert run("apply", "--root", str(path), "--gpu", "18:00.0") == 0
    admin = "options nvidia NVreg_EnableGpuFirmware=0"
    edit(path, MODPROBE, "softdep nouveau", f"{admin}\nsoftdep nouveau")
    assert run("apply", "--root", str(path), "--gpu", "18:00.0", "--gpu", "19:00.0") == 0
    assert run("undo", "--root", str(path)) == 0
    assert (path / MODPROBE).read_text() == admin + "\n"
    assert changed(before, snapshot_tree(path)) == [MODPROBE]


def test_a_file_of_ours_deleted_between_two_applies_is_undone_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The admin removed the modprobe file the first apply made; the second made it again.
    Undo of both leaves it absent, as both found it: nothing the admin did is lost, so no
    refusal (it said "deleted since apply" and asked for --force)."""
    path = build(tmp_path, "consumer-intel", {})
    before = snapshot_tree(path)
    assert run("apply", "--root", str(path)) == 0
    (path / MODPROBE).unlink()
    assert run("apply", "--root", str(path)) == 0
    capsys.readouterr()
    assert run("undo", "--root", str(path)) == 0, capsys.readouterr().err
    assert not (path / MODPROBE).exists()
    assert changed(before, snapshot_tree(path)) == []


def test_a_file_we_modified_then_deleted_between_two_applies_is_still_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where the first apply edited a file the host had, and the admin deleted it before
    the second apply made it anew, putting the original back would undo the admin's
    deletion: refused and named, as before."""
    path = build(tmp_path, "consumer-intel", {})
    modules = "etc/initramfs-tools/modules"
    assert (path / modules).exists()
    assert run("apply", "--root", str(path)) == 0
    (path / modules).unlink()
    assert run("apply", "--root", str(path)) == 0
    capsys.readouterr()
    assert run("undo", "--root", str(path)) == 2
    assert f"/{modules} (deleted since apply)" in capsys.readouterr().err


def test_status_after_undo_says_how_each_file_was_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After an undo that kept an admin's edit of a file we made, status named that file
    "removed" though it is there with the admin's line: now "ours out"; a file we made and
    nobody touched is "removed", one we edited "restored"."""
    import json

    path = build(tmp_path, "hgx-h100", {})
    assert run("apply", "--root", str(path), "--gpu", "18:00.0") == 0
    edit(
        path,
        MODPROBE,
        "softdep nouveau",
        "options nvidia NVreg_EnableGpuFirmware=0\nsoftdep nouveau",
    )
    assert run("apply", "--root", str(path), "--gpu", "18:00.0", "--gpu", "19:00.0") == 0
    assert run("undo", "--root", str(path)) == 0
    capsys.readouterr()
    assert run("status", "--root", str(path), "--json") == 0
    undo = json.loads(capsys.readouterr().out)["transactions"][-1]
    assert undo["kind"] == "undo"
    got = {f["path"]: f["change"] for f in undo["files"]}
    assert got == {
        f"/{MODPROBE}": "ours out",
        "/etc/udev/rules.d/40-passthrough-vfio.rules": "removed",
        "/etc/initramfs-tools/modules": "restored",
    }
    assert (path / MODPROBE).exists()


def test_the_backup_of_an_edit_between_two_applies_is_kept_and_needed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The second apply backs up what it found (the admin's edit): undo needs it. With it
    gone, that file is left as it is and named (exit 3), never put back from the first."""
    path = sdboot(tmp_path)
    assert run("apply", "--root", str(path)) == 0
    edit(path, CMDLINE, "UUID=abcd", "UUID=ef01")
    assert run("apply", "--root", str(path), "--hugepages-1g", "2") == 0
    kept = sorted((path / "var/lib/passthrough/backups").rglob("*etc_kernel_cmdline"))
    assert len(kept) == 2, kept  # the original, and the file as the second apply found it
    second = max(kept, key=lambda p: p.parent.name)
    assert b"UUID=ef01" in second.read_bytes()
    second.unlink()
    applied = (path / CMDLINE).read_bytes()
    capsys.readouterr()
    assert run("undo", "--root", str(path)) == 3
    err = capsys.readouterr().err
    assert f"/{CMDLINE} (/{second.relative_to(path)} is gone)" in err, err
    assert (path / CMDLINE).read_bytes() == applied


def _kernel_line(root: Path, shell: str) -> list[str]:
    """What grub-mkconfig gets: /etc/default/grub and grub.d sourced by ``shell``."""
    script = (
        '. "$1/etc/default/grub"; for f in "$1"/etc/default/grub.d/*.cfg; do '
        '[ -e "$f" ] && . "$f"; done; echo "$GRUB_CMDLINE_LINUX $GRUB_CMDLINE_LINUX_DEFAULT"'
    )
    r = subprocess.run([shell, "-c", script, shell, str(root)], capture_output=True, text=True)
    assert r.returncode == 0 and not r.stderr, r.stderr
    return r.stdout.split()


ADMIN_FORMS = {
    # the admin adds a word of theirs to our list
    "our loop, extended": lambda line, var, words: line.replace(
        " in ", " in nomodeset 'quiet splash' ", 1
    ),
    # the form most guides show, no braces
    "an assignment": lambda line, var, words: (
        f"{var}=\"${var} {' '.join(words)} nomodeset 'quiet splash'\""
    ),
    "an assignment to the other variable": lambda line, var, words: (
        f"GRUB_CMDLINE_LINUX=\"$GRUB_CMDLINE_LINUX {' '.join(words)} nomodeset 'quiet splash'\""
    ),
}


@pytest.mark.parametrize("form", sorted(ADMIN_FORMS))
def test_our_loop_line_rewritten_after_a_second_apply_keeps_only_the_admins_words(
    tmp_path: Path, form: str
) -> None:
    """Two transactions wrote our drop-in (the second with huge pages); then the admin
    rewrites our appending line. Undo takes our words out of it through both
    transactions (takeback reads our loop line itself): sourced by real bash and dash,
    the GRUB files give the original kernel line plus the admin's words, nothing of ours."""
    path = build(tmp_path, "consumer-intel", {})
    before = snapshot_tree(path)
    original = _cmdline(path).split()
    assert run("apply", "--root", str(path)) == 0
    assert run("apply", "--root", str(path), "--hugepages-1g", "2") == 0
    *header, line = (path / DROPIN).read_text().rstrip("\n").split("\n")
    ours = loop_words(line)
    assert ours is not None and "hugepages=2" in ours[1], line
    admin = ADMIN_FORMS[form](line, ours[0], ours[1])
    (path / DROPIN).write_text("\n".join([*header, admin]) + "\n")
    meant = _kernel_line(path, "bash")
    assert "nomodeset" in meant and "hugepages=2" in meant
    assert run("undo", "--root", str(path)) == 0
    for shell in ("bash", "dash"):
        got = _kernel_line(path, shell)
        assert got == [w for w in meant if w not in ours[1]], (shell, got)
        assert set(original) <= set(got) and "nomodeset" in got, got
    assert changed(before, snapshot_tree(path)) == [DROPIN]
