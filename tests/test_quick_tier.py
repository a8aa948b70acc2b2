# SPDX-License-Identifier: Apache-2.0
"""What the quick tier sets up for its speed (tests/conftest.py `quick_tier_setup`, docs/testing.md
"Time"): its temporary trees on a tmpfs unless the contributor chose a place, its bytecode kept
outside the sources even where PYTHONDONTWRITEBYTECODE is set, and both seen by the processes
its tests start. Real files, a real mount table, real interpreters."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .conftest import QUICK_TEMPROOT, REPO, is_tmpfs, quick_tier_setup


def _mounts(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / f"mounts{len(list(tmp_path.glob('mounts*')))}"
    path.write_text("".join(f"{line}\n" for line in lines))
    return str(path)


def test_a_tmpfs_is_told_from_a_disk_and_from_no_mount(tmp_path: Path) -> None:
    here = str(tmp_path)
    tmpfs = _mounts(tmp_path, "/dev/vda / ext4 rw 0 0", f"tmpfs {here} tmpfs rw,size=1g 0 0")
    disk = _mounts(tmp_path, f"/dev/vda {here} ext4 rw 0 0")
    assert is_tmpfs(here, tmpfs)
    assert not is_tmpfs(here, disk)
    assert not is_tmpfs(here + "/below", tmpfs)  # a directory on it is no mount point
    assert not is_tmpfs(here, str(tmp_path / "no-such-table"))
    free = os.statvfs(here).f_bavail * os.statvfs(here).f_frsize
    assert not is_tmpfs(here, tmpfs, need=free + (1 << 30))  # a container's small /dev/shm


@pytest.fixture
def own_sys(monkeypatch: pytest.MonkeyPatch) -> None:
    """quick_tier_setup sets this process's bytecode settings: put them back after."""
    monkeypatch.setattr(sys, "dont_write_bytecode", sys.dont_write_bytecode)
    monkeypatch.setattr(sys, "pycache_prefix", sys.pycache_prefix)


@pytest.mark.usefixtures("own_sys")
def test_the_tmpfs_is_taken_only_where_no_place_was_chosen(tmp_path: Path) -> None:
    mounts = _mounts(tmp_path, f"tmpfs {QUICK_TEMPROOT} tmpfs rw 0 0")
    env: dict[str, str] = {"PYTHONDONTWRITEBYTECODE": "1"}
    quick_tier_setup(env, basetemp_given=False, mounts=mounts)
    assert env == {
        "PYTEST_DEBUG_TEMPROOT": QUICK_TEMPROOT,
        "PYTHONPYCACHEPREFIX": str(REPO / ".pytest_cache" / "pycache"),
    }
    assert sys.dont_write_bytecode is False and sys.pycache_prefix == env["PYTHONPYCACHEPREFIX"]
    for chosen in ({"TMPDIR": "/var/tmp"}, {"PYTEST_DEBUG_TEMPROOT": "/srv/t"}):
        env = dict(chosen)
        quick_tier_setup(env, basetemp_given=False, mounts=mounts)
        assert env.items() >= chosen.items() and env.get("PYTEST_DEBUG_TEMPROOT") != QUICK_TEMPROOT
    env = {"PYTHONPYCACHEPREFIX": "/mine"}  # the contributor's own cache stays theirs
    quick_tier_setup(env, basetemp_given=True, mounts=mounts)
    assert env == {"PYTHONPYCACHEPREFIX": "/mine"}  # --basetemp: no tmpfs either
    quick_tier_setup(env, basetemp_given=False, mounts=_mounts(tmp_path, "/dev/vda / ext4 rw"))
    assert "PYTEST_DEBUG_TEMPROOT" not in env
    worker = {"PYTEST_XDIST_WORKER": "gw1", "PYTHONDONTWRITEBYTECODE": "1"}
    quick_tier_setup(worker, basetemp_given=True, mounts=mounts)
    assert worker == {"PYTEST_XDIST_WORKER": "gw1", "PYTHONDONTWRITEBYTECODE": "1"}


def test_this_run_and_the_processes_it_starts_use_what_was_set_up(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """In the quick tier, where it took the tmpfs (/dev/shm is one here), this test's files,
    its TMPDIR and a started interpreter's are on it; the interpreter writes bytecode, under
    the prefix, where this process's own compiled modules already are. Any other run keeps
    the system's temporary directory."""
    code = "import sys, tempfile; print(sys.flags.dont_write_bytecode, tempfile.gettempdir())"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    writes, child_tmp = run.stdout.split()
    shm = Path(QUICK_TEMPROOT).resolve()
    if request.config.getoption("markexpr") != "quick":
        chosen = {"TMPDIR", "PYTEST_DEBUG_TEMPROOT"} & set(os.environ)
        assert chosen or request.config.option.basetemp or not tmp_path.is_relative_to(shm)
        return
    assert writes == "0"
    compiled = importlib.util.cache_from_source(str(REPO / "passthrough/cli/__init__.py"))
    assert compiled.startswith(os.environ["PYTHONPYCACHEPREFIX"]) and Path(compiled).is_file()
    if os.environ.get("PYTEST_DEBUG_TEMPROOT") == QUICK_TEMPROOT:
        for path in (tmp_path, Path(tempfile.gettempdir()), Path(child_tmp)):
            assert path.is_relative_to(shm), path
