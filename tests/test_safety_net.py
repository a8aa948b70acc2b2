# SPDX-License-Identifier: Apache-2.0
"""The safety net against what the world does to it: a swapped or cut backup, a hostile
journal, links planted in our state directory, any umask, files with unusual modes,
owners and extended attributes, directories apply made."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from passthrough.cli import main
from passthrough.journal import files as files_mod
from passthrough.journal.files import Faults

from .conftest import tree_hash
from .test_faults import MODULES, STATE, cli, counted, diff, in_child, temps, tree_state
from .test_plan import build

JOURNAL = f"{STATE}/journal.json"
DROPIN = "etc/default/grub.d/99-passthrough.cfg"


def fresh(tmp_path: Path) -> Path:
    return build(tmp_path, "consumer-intel", {})


def backup_of(root: Path, rel: str) -> Path:
    (found,) = (root / STATE / "backups").rglob("*" + rel.replace("/", "_"))
    return found


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("passthrough: error:")]
    return line


@pytest.mark.parametrize("damage", ["swapped", "truncated"])
def test_undo_never_restores_a_backup_that_does_not_match_the_journal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str
) -> None:
    root = fresh(tmp_path)
    original = tree_state(root)
    assert main(["apply", "--root", str(root)]) == 0
    backup = backup_of(root, MODULES)
    good = backup.read_bytes()
    backup.write_bytes(b"garbage\n" if damage == "swapped" else good[: len(good) // 2])
    applied = (root / MODULES).read_bytes()
    forced = tmp_path / "forced"
    shutil.copytree(root, forced, symlinks=True)
    capsys.readouterr()
    for _again in range(2):
        assert main(["undo", "--root", str(root)]) == 3
        line = error_line(capsys)
        assert f"/{MODULES}" in line and "does not hash to what the journal recorded" in line
        assert str(backup.relative_to(root)) in line
        assert (root / MODULES).read_bytes() == applied  # left as it is
        assert diff(tree_state(root), original) == [MODULES]  # the rest is restored
    backup.write_bytes(good)  # the admin puts the right one back
    assert main(["undo", "--root", str(root)]) == 0
    assert diff(tree_state(root), original) == []
    # --force never restores it either: it leaves that file as it is, and says so
    assert main(["undo", "--root", str(forced), "--force"]) == 0
    assert "does not hash to what the journal recorded" in capsys.readouterr().err
    assert (forced / MODULES).read_bytes() == applied


@pytest.mark.root  # chown to another owner
def test_a_file_with_unusual_mode_owner_and_xattrs_keeps_them(tmp_path: Path) -> None:
    root = fresh(tmp_path)
    target = root / MODULES
    os.chmod(target, 0o640)
    os.chown(target, 1234, 2345)
    os.setxattr(target, "user.passthrough-test", b"kept\0value")
    original = tree_state(root)
    assert main(["apply", "--root", str(root)]) == 0
    st = os.lstat(target)
    assert b"vfio" in target.read_bytes()
    assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o640, 1234, 2345)
    assert os.getxattr(target, "user.passthrough-test") == b"kept\0value"
    backup = backup_of(root, MODULES)
    assert os.lstat(backup).st_mode & 0o7777 == 0o600  # the original's bytes stay private
    assert main(["undo", "--root", str(root)]) == 0
    assert diff(tree_state(root), original) == []
    # a removed file comes back with them too: the admin deletes it, undo --force restores
    assert main(["apply", "--root", str(root)]) == 0
    target.unlink()
    assert main(["undo", "--root", str(root), "--force"]) == 0
    assert diff(tree_state(root), original) == []


LABELS = {  # what SELinux and IMA keep there; root may set them on ext4 and tmpfs alike
    "security.selinux": b"system_u:object_r:etc_t:s0\0",
    "trusted.passthrough-test": b"kept",
    "user.passthrough-test": b"kept too",
}


@pytest.fixture(params=["disk", "tmpfs"])
def labelled(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A host whose /etc/initramfs-tools/modules carries security.*, trusted.* and user.*
    attributes, on the test's own disk or on a real tmpfs (unmounted in a finally)."""
    at = tmp_path / "fs"
    at.mkdir()
    if request.param == "tmpfs":
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "labelled", str(at)], check=True)
    try:
        root = fresh(at)
        for name, value in LABELS.items():
            os.setxattr(root / MODULES, name, value)
        yield root
    finally:
        if request.param == "tmpfs":
            subprocess.run(["umount", str(at)], check=True)


@pytest.mark.root  # security.* and trusted.* need CAP_SYS_ADMIN; the tmpfs, mount(2)
def test_security_and_trusted_xattrs_are_kept_on_a_rewritten_file(labelled: Path) -> None:
    root, target = labelled, labelled / MODULES
    assert files_mod.xattrs_of(str(target)) == LABELS
    original = tree_state(root)
    assert main(["apply", "--root", str(root)]) == 0
    assert b"vfio" in target.read_bytes()
    assert files_mod.xattrs_of(str(target)) == LABELS  # the rewritten file
    assert files_mod.xattrs_of(str(backup_of(root, MODULES))) == LABELS  # and its backup
    with target.open("a") as fh:  # an admin's line: undo takes ours out, keeps the rest
        fh.write("dm_crypt\n")
    assert main(["undo", "--root", str(root)]) == 0
    assert target.read_bytes() == original[MODULES][4] + b"dm_crypt\n"  # type: ignore[operator]
    assert files_mod.xattrs_of(str(target)) == LABELS
    target.write_bytes(original[MODULES][4])  # type: ignore[arg-type]
    assert diff(tree_state(root), original) == []
    # deleted after apply: undo --force brings it back from the backup, labels and all
    assert main(["apply", "--root", str(root)]) == 0
    target.unlink()
    assert main(["undo", "--root", str(root), "--force"]) == 0
    assert diff(tree_state(root), original) == []


@pytest.mark.parametrize("umask", [0o000, 0o077])
def test_modes_are_ours_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    root = fresh(tmp_path)
    original = tree_state(root)
    err = tmp_path / "stderr"
    run = lambda: main(["apply", "--root", str(root)])  # noqa: E731
    assert in_child(run, Faults(), err, umask=umask) == 0, err.read_text()

    def mode(rel: str) -> int:
        return os.lstat(root / rel).st_mode & 0o7777

    assert mode("etc/default/grub.d") == 0o755  # update-grub sources it as root
    assert mode(DROPIN) == 0o644 and mode("etc/modprobe.d/passthrough-vfio.conf") == 0o644
    assert mode(MODULES) == original[MODULES][1]
    assert mode(STATE) == 0o700 and mode(f"{STATE}/backups") == 0o700
    assert mode("var/lib") == 0o755
    assert mode(JOURNAL) == 0o600 and mode(f"{STATE}/lock") == 0o600
    for p in (root / STATE / "backups").rglob("*"):
        assert stat.S_IMODE(p.lstat().st_mode) == (0o700 if p.is_dir() else 0o600), p
    undo = lambda: main(["undo", "--root", str(root)])  # noqa: E731
    assert in_child(undo, Faults(), err, umask=umask) == 0, err.read_text()
    assert diff(tree_state(root), original) == []


def test_undo_removes_the_directory_apply_made_and_only_that(tmp_path: Path) -> None:
    root = fresh(tmp_path)
    assert not (root / "etc/default/grub.d").exists()
    assert main(["apply", "--root", str(root)]) == 0
    journal = json.loads((root / JOURNAL).read_text())
    made = [d for s in journal["transactions"][0]["steps"] for d in s.get("made_dirs", [])]
    assert made == ["etc/default/grub.d"]
    assert main(["undo", "--root", str(root)]) == 0
    assert not (root / "etc/default/grub.d").exists()
    assert (root / "etc/default").is_dir()  # there before: kept
    # an admin's file in it since: the directory stays, with their file
    assert main(["apply", "--root", str(root)]) == 0
    (root / "etc/default/grub.d/50-admin.cfg").write_text("GRUB_TIMEOUT=3\n")
    assert main(["undo", "--root", str(root)]) == 0
    assert os.listdir(root / "etc/default/grub.d") == ["50-admin.cfg"]


def _nested(depth: int) -> str:
    return '{"version": 2, "transactions": ' + "[" * depth + "]" * depth + "}"


def _tx(**step: object) -> str:
    base = {"n": 0, "kind": "write", "state": "done", "path": MODULES, "existed": True}
    tx = {"id": "t0", "kind": "apply", "state": "complete", "started": 0, "steps": [base | step]}
    return json.dumps({"version": 2, "transactions": [tx]})


HOSTILE = {
    "deep nesting": _nested(100000),
    "1e400": _tx().replace('"started": 0', '"started": 1e400'),
    "NaN": _tx().replace('"started": 0', '"started": NaN'),
    "NUL in a path": _tx(path="etc/initramfs-tools/modules\u0000x"),
    "a string for a mode": _tx(mode="0644"),
    "a list for a state": _tx(state=["done"]),
    "a number for argv": _tx(kind="run", argv=[1, 2]),
    "a backup outside our state": _tx(backup="etc/shadow", before_sha256="0" * 64),
    "a bad hash": _tx(written_sha256="not a hash"),
    "a dir climbing out": _tx(made_dirs=["../../../etc"]),
    "not an object": "[1, 2, 3]",
    "not UTF-8": '{"version": 2, "transactions": ["\udcff"]}',
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_journal_is_one_line_and_nothing_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    root = fresh(tmp_path)
    assert main(["apply", "--root", str(root)]) == 0
    journal = root / JOURNAL
    text = HOSTILE[case]
    journal.write_bytes(text.encode("utf-8", "surrogateescape"))
    os.unlink(root / STATE / "lock")
    frozen = tree_hash(root)
    capsys.readouterr()
    for argv in (["undo"], ["undo", "--force"], ["status"], ["apply"], ["verify"]):
        assert main([*argv, "--root", str(root)]) == 2, argv
        line = error_line(capsys)
        assert str(journal) in line and "move it aside" in line, line
        assert len(line) < 600
    assert tree_hash(root) == frozen  # not even a lock file


@pytest.mark.parametrize("where", [f"{STATE}/backups", f"{STATE}/backups/t0"])
def test_a_link_in_our_state_directory_is_refused_and_never_followed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    """(``var/lib/passthrough`` itself is resolved inside the root as a chroot would:
    tests/test_hostile_contain.py.) Below it, a link is refused before anything changes:
    pruning once followed one and deleted a file that was not ours."""
    root = fresh(tmp_path)
    assert main(["apply", "--root", str(root)]) == 0
    assert main(["undo", "--root", str(root)]) == 0
    elsewhere = tmp_path / "not-ours"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("someone else's file\n")
    target = root / where
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        os.rmdir(target)
    target.symlink_to(elsewhere)
    frozen = tree_hash(tmp_path)
    capsys.readouterr()
    if where.endswith("/t0"):  # a stray link among the backups: pruned, never followed
        assert main(["apply", "--root", str(root)]) == 0
        assert not os.path.lexists(target)
    else:
        for argv in (["apply"], ["undo"]):
            assert main([*argv, "--root", str(root)]) == 2, argv
            line = error_line(capsys)
            assert f"{root / where}: a symbolic link" in line and "nothing was changed" in line
        assert tree_hash(tmp_path) == frozen
    assert (elsewhere / "precious").read_text() == "someone else's file\n"


def test_a_temporary_file_left_by_a_kill_is_listed_then_removed_by_the_next_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    steady = fresh(tmp_path)
    assert main(["apply", "--root", str(steady)]) == 0
    assert main(["undo", "--root", str(steady)]) == 0
    probe = tmp_path / "probe"
    shutil.copytree(steady, probe, symlinks=True)
    log = counted(probe, "apply").log
    renames = [n for n, (what, _path) in enumerate(log, 1) if what == "rename"]
    assert len(renames) >= 6  # backups, files, journal saves
    err = tmp_path / "stderr"
    for n in renames:  # killed at a rename: the temporary file is there
        root = tmp_path / f"r{n}"
        shutil.copytree(steady, root, symlinks=True)
        assert in_child(cli(root, "apply"), Faults("kill", n), err) == -9
        left = sorted("/" + t for t in temps(root))
        assert left, n
        capsys.readouterr()
        assert main(["status", "--root", str(root), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["temporary_files"] == left, n
        assert main(["status", "--root", str(root)]) == 0
        (line,) = [x for x in capsys.readouterr().out.splitlines() if "Temporary files" in x]
        assert line.endswith("removes them): " + ", ".join(left)), line
        assert sorted("/" + t for t in temps(root)) == left, n  # status changes nothing
        # the next run, apply or undo, removes them; then status lists none
        assert main(["apply" if n % 2 else "undo", "--root", str(root)]) == 0
        assert temps(root) == [], n
        assert main(["undo", "--root", str(root)]) == 0
        capsys.readouterr()
        assert main(["status", "--root", str(root), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["temporary_files"] == [], n


def test_status_describes_an_undo_cut_off_mid_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    applied = fresh(tmp_path)
    original = tree_state(applied)
    assert main(["apply", "--root", str(applied)]) == 0
    probe = tmp_path / "probe"
    shutil.copytree(applied, probe, symlinks=True)
    log = counted(probe, "undo").log
    # the rename that puts the first file back: its write is journaled, not yet recorded
    (n, path) = next(
        (i, p) for i, (what, p) in enumerate(log, 1) if what == "rename" and STATE not in p
    )
    rel = os.path.relpath(path, probe)
    err = tmp_path / "stderr"
    assert in_child(cli(applied, "undo"), Faults("kill", n), err) == -9
    capsys.readouterr()
    assert main(["status", "--root", str(applied)]) == 0
    out = capsys.readouterr().out
    assert "undo running (undoes" in out and "— cut off unless still running" in out
    assert f"restoring /{rel}  [cut-off]" in out
    assert main(["undo", "--root", str(applied)]) == 0
    assert diff(tree_state(applied), original) == []
