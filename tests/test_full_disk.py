# SPDX-License-Identifier: Apache-2.0
"""A real full disk: the host laid on a small tmpfs the kernel fills, apply and undo run
until each of their writes in turn meets a real ENOSPC (no fault hook involved).

The tmpfs is mounted fresh for the module (root: ``mount -t tmpfs -o size=…``) and
unmounted in a ``finally``. For each fill level a fresh copy of the host goes onto it, a
filler file takes all but ``k`` pages of what is free, and the command runs in a forked
child. Afterwards: one error line naming the full disk, no traceback, every file entirely
old or entirely new (byte for byte, with its mode, owner and xattrs); ``status`` describes
it while the disk is still full; then the filler goes, ``undo`` converges to the original
tree and nothing of ours is left (no temporary file, no backup). ``k`` grows until the
command succeeds: each level stops it one page further on.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from passthrough.cli import main
from passthrough.journal.files import Faults

from .test_faults import STATE, Tree, cli, diff, in_child, temps, tree_state
from .test_plan import build

pytestmark = pytest.mark.root  # mount(2)

PAGE = 4096
SIZE = "2m"  # the sample host takes about 231 pages of it (one per non-empty file)
INODES = 1024  # the host takes about 450
MOST_LEVELS = 80  # far more pages than apply or undo of this host ever needs


@pytest.fixture(scope="module")
def disk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    assert os.geteuid() == 0, "mounts a tmpfs: run the root tier as root (CI does)"
    mnt = tmp_path_factory.mktemp("full-disk")
    subprocess.run(
        [
            "mount",
            "-t",
            "tmpfs",
            "-o",
            f"size={SIZE},nr_inodes={INODES},mode=0755",
            "passthrough-full",
            str(mnt),
        ],
        check=True,
    )
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """consumer-intel as it is, and applied (on the ordinary disk)."""
    base = tmp_path_factory.mktemp("full-disk-templates")
    fresh = build(base / "fresh", "consumer-intel", {})
    applied = base / "applied"
    shutil.copytree(fresh, applied, symlinks=True)
    assert main(["apply", "--root", str(applied)]) == 0
    return {"fresh": fresh, "applied": applied}


def entirely_old_or_new(root: Path, trees: list[Tree], level: tuple[str, int]) -> None:
    for rel, entry in tree_state(root).items():
        assert entry in [t.get(rel) for t in trees], (level, rel)


def fill(disk: Path, what: str, left: int) -> Path:
    """Filler beside the root taking all but ``left`` pages (``what`` = "pages": one
    file) or inodes ("inodes": empty files) of what is free."""
    st = os.statvfs(disk)
    filler = disk / "filler"
    filler.mkdir()
    if what == "pages":
        with (filler / "0").open("wb") as fh:
            fh.write(b"\0" * max(0, st.f_bavail * st.f_frsize - left * PAGE))
        assert os.statvfs(disk).f_bavail * st.f_frsize <= left * PAGE
    else:
        for n in range(os.statvfs(disk).f_ffree - left):
            (filler / str(n)).touch()
        assert os.statvfs(disk).f_ffree == left
    return filler


def ours_left(root: Path) -> list[str]:
    backups = root / STATE / "backups"
    kept = [str(p) for p in backups.rglob("*") if p.is_file()] if backups.exists() else []
    return temps(root) + kept


def status_of(root: Path) -> list[tuple[str, str]]:
    """``status --json``: each transaction's kind and state."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["status", "--root", str(root), "--json"]) == 0
    return [(t["kind"], t["state"]) for t in json.loads(out.getvalue())["transactions"]]


def one_level(
    disk: Path, templates: dict[str, Path], cmd: str, level: tuple[str, int], err: Path
) -> str | None:
    """``cmd`` on a fresh copy of its template with ``level`` (pages or inodes, how many)
    free: None when it succeeded, else the error line, once everything the module's
    docstring asks held."""
    root = disk / "root"
    if root.exists():
        shutil.rmtree(root)
    if (disk / "filler").exists():
        shutil.rmtree(disk / "filler")
    shutil.copytree(templates["fresh" if cmd == "apply" else "applied"], root, symlinks=True)
    trees = [tree_state(templates[t]) for t in ("fresh", "applied")]
    filler = fill(disk, *level)
    rc = in_child(cli(root, cmd), Faults(), err)
    text = err.read_text()
    assert "Traceback" not in text, text
    if rc == 0:
        return None
    errors = [line for line in text.splitlines() if line.startswith("passthrough: error:")]
    assert rc in (2, 3) and len(errors) == 1, (level, text)
    assert "No space left on device" in errors[0] and str(root) in errors[0], errors
    entirely_old_or_new(root, trees, level)
    # status, on the full disk (it writes nothing), tells where it stopped
    txs = status_of(root)
    if cmd == "undo":  # the undo journaled and cut off, or not journaled at all
        assert txs[-1] in (("undo", "running"), ("apply", "complete")), (level, txs)
        if txs[-1] == ("apply", "complete"):  # not journaled: it says nothing changed
            assert "nothing on the host changed" in errors[0], errors
    elif "partly changed" in errors[0]:
        # cut off: the journal says "failed" where it still had room to record that, and
        # "running" where it did not (the error line then says it could not record it)
        unrecorded = "the journal could not record it" in errors[0]
        assert txs == [("apply", "running" if unrecorded else "failed")], (level, txs, errors)
    else:  # stopped before its transaction was journaled: nothing applied
        assert txs == [], (level, txs)
    shutil.rmtree(filler)  # make room, as the error says
    assert main(["undo", "--root", str(root)]) == 0, (level, text)
    assert diff(tree_state(root), trees[0]) == [], level
    assert ours_left(root) == [], level
    return errors[0]


@pytest.mark.parametrize("what", ["pages", "inodes"])
@pytest.mark.parametrize("cmd", ["apply", "undo"])
def test_enospc_at_each_write_in_turn(
    disk: Path,
    templates: dict[str, Path],
    tmp_path: Path,
    cmd: str,
    what: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = tmp_path / "stderr"
    errors: list[str] = []
    stops: set[tuple[int, str]] = set()
    for left in range(MOST_LEVELS):
        line = one_level(disk, templates, cmd, (what, left), err)
        if line is None:
            break
        errors.append(line)
        stops.add((err.read_text().count("  · "), line))  # how far it got, where it stopped
    else:
        pytest.fail(f"{cmd} still hit a full disk with {MOST_LEVELS} {what} free")
    # each level stopped the command somewhere: the distinct places (how many steps it had
    # begun, the file the error names) are the fault points covered
    with capsys.disabled():
        print(f"\n{cmd}, {what}: {len(errors)} levels hit ENOSPC, at {len(stops)} distinct points")
    # undo replaces files (each rename frees what the new one took): a real disk stops it
    # at its first one or two writes; the hook harness (test_faults.py) reaches the rest
    assert len(stops) >= (4 if cmd == "apply" else 1), sorted(stops)
