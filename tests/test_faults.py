# SPDX-License-Identifier: Apache-2.0
"""Faults at every point of apply and undo: a SIGKILL, a full disk, a short write.

The harness forks a child per fault point and runs the real CLI in it on a real tree,
with the fault armed through files.FAULTS (the hook every change to a tree passes
through: ``kill:N`` sends the child a real SIGKILL, ``enospc:N`` raises ENOSPC where
the N-th allocating call would be made). The parent then runs ``status`` and a
converging ``undo`` (or ``apply``) and asserts: the originals byte for byte (modes,
owners and extended attributes too), nothing of ours left, no traceback. A real kernel
fault backs the hook: RLIMIT_FSIZE makes the kernel cut a write short, then refuse it.
"""

from __future__ import annotations

import os
import resource
import shutil
import stat
import subprocess
import sys
import traceback
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pytest

from passthrough.boot.shellvars import loop_words
from passthrough.cli import main
from passthrough.journal import files as files_mod
from passthrough.journal.files import Faults

from .test_plan import build

MODULES = "etc/initramfs-tools/modules"
CMDLINE = "etc/kernel/cmdline"
STATE = "var/lib/passthrough"
Tree = dict[str, tuple[object, ...]]


def tree_state(root: Path, with_state: bool = False) -> Tree:
    """Every entry outside our state directory: type, mode, owner, group, bytes or link
    target, extended attributes."""
    out: Tree = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            if not with_state and (STATE.startswith(rel + "/") or rel.startswith(STATE)):
                continue  # our state directory (and the parents it needed) stay
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                body: object = os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                body = Path(p).read_bytes()
            else:
                body = None
            xattrs = {} if stat.S_ISLNK(st.st_mode) else files_mod.xattrs_of(p)
            out[rel] = (
                stat.S_IFMT(st.st_mode),
                st.st_mode & 0o7777,
                st.st_uid,
                st.st_gid,
                body,
                xattrs,
            )
    return out


def diff(a: Tree, b: Tree) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def temps(root: Path) -> list[str]:
    return [str(p.relative_to(root)) for p in root.rglob(f"*{files_mod.TEMP_SUFFIX}")]


def in_child(fn: Callable[[], int], fault: Faults, err: Path, umask: int | None = None) -> int:
    """``fn()`` in a forked child with ``fault`` armed: its exit code (-9: killed). Its
    stderr comes back through a pipe (no file size limit applies to a pipe) into ``err``."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 99
        try:
            os.close(r)
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
            sys.stderr = os.fdopen(w, "w", buffering=1)
            if umask is not None:
                os.umask(umask)
            files_mod.FAULTS = fault
            code = fn()
            sys.stderr.flush()
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        err.write_bytes(pipe.read())
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def cli(root: Path, *argv: str) -> Callable[[], int]:
    return lambda: main([*argv, "--root", str(root)])


def counted(root: Path, *argv: str) -> Faults:
    """The command run with the hook counting: how many changes to the tree (``seen``,
    ``allocating``) it makes, and which (``log``)."""
    files_mod.FAULTS = Faults("count")
    try:
        assert main([*argv, "--root", str(root)]) == 0
        return files_mod.FAULTS
    finally:
        files_mod.FAULTS = Faults()


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """consumer-intel as it is, applied, applied then edited by an admin, applied then
    undone (our state directory kept): each copied for every fault point."""
    base = tmp_path_factory.mktemp("faults")
    fresh = build(base / "fresh", "consumer-intel", {})
    # Proxmox: apply appends to the line in /etc/kernel/cmdline (a file edited in place)
    out = {"fresh": fresh, "pve-fresh": build(base / "pve-fresh", "acs-override-proxmox", {})}
    for name, steps in {
        "applied": ["apply"],
        "edited": ["apply", "edit"],
        "undone": ["apply", "undo"],
        "pve-word-edited": ["apply", "word-edit"],
    }.items():
        path = base / name
        shutil.copytree(
            out["pve-fresh" if name.startswith("pve-") else "fresh"], path, symlinks=True
        )
        for step in steps:
            if step == "edit":
                with (path / MODULES).open("a") as fh:
                    fh.write("dm_crypt\n")
            elif step == "word-edit":  # the admin's word on the line we appended to
                cmdline = path / CMDLINE
                cmdline.write_text(cmdline.read_text().rstrip("\n") + " nomodeset\n")
            else:
                assert main([step, "--root", str(path)]) == 0
        out[name] = path
    return out


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def converge(root: Path, err: Path, expect: Tree, also_apply: Tree | None = None) -> None:
    """After a fault: status describes it, then undo (or apply, then undo) converges."""
    assert main(["status", "--root", str(root)]) == 0
    if also_apply is not None:
        assert main(["apply", "--root", str(root)]) == 0
        assert diff(tree_state(root), also_apply) == []
    assert main(["undo", "--root", str(root)]) == 0, err.read_text()
    assert diff(tree_state(root), expect) == []
    assert temps(root) == []


# (template, command, what undo returns to): the tree to copy, the command faulted
SCENARIOS = {
    "apply": ("fresh", "apply", "fresh"),
    "undo": ("applied", "undo", "fresh"),
    "undo-after-edit": ("edited", "undo", None),  # the admin's line stays
    "apply-after-undo": ("undone", "apply", "fresh"),
    "undo-after-word-edit": ("pve-word-edited", "undo", None),  # the admin's word stays
}


def expected(trees: dict[str, Path], tmp: Path, scenario: str) -> Tree:
    template, _cmd, goal = SCENARIOS[scenario]
    if goal is not None:
        return tree_state(trees[goal])
    ref = copy(trees[template], tmp / "reference")
    assert main(["undo", "--root", str(ref)]) == 0
    state = tree_state(ref)
    if template == "edited":
        assert b"dm_crypt\n" in state[MODULES][4]  # type: ignore[operator]
        assert b"vfio" not in state[MODULES][4]  # type: ignore[operator]
    else:  # the original line, the admin's word after it, ours gone
        original = (trees["pve-fresh"] / CMDLINE).read_bytes().rstrip(b"\n")
        assert state[CMDLINE][4] == original + b" nomodeset\n"
        assert diff(state, tree_state(trees["pve-fresh"])) == [CMDLINE]
    return state


def points(total: int, exhaustive: bool) -> list[int]:
    """Every point, or a spread of them for the fast loop: the first, the last, and about
    six between (every kind of change appears among them: see the counts in the report)."""
    if exhaustive:
        return list(range(1, total + 1))
    return sorted({1, total, *range(1 + total // 13, total, max(1, total // 6))})


def kill_points(trees: dict[str, Path], tmp: Path, scenario: str, exhaustive: bool) -> int:
    template, cmd, _goal = SCENARIOS[scenario]
    want = expected(trees, tmp, scenario)
    applied = tree_state(trees["applied"])
    total = counted(copy(trees[template], tmp / "probe"), cmd).seen
    err = tmp / "stderr"
    chosen = points(total, exhaustive)
    for n in chosen:
        root = copy(trees[template], tmp / f"k{n}")
        assert in_child(cli(root, cmd), Faults("kill", n), err) == -9, (n, err.read_text())
        # half the points converge through apply first (then undo), half through undo
        again = applied if cmd == "apply" and n % 2 else None
        converge(root, err, want, again)
        shutil.rmtree(root)
    return len(chosen)


def enospc_points(trees: dict[str, Path], tmp: Path, scenario: str, exhaustive: bool) -> int:
    template, cmd, _goal = SCENARIOS[scenario]
    want = expected(trees, tmp, scenario)
    total = counted(copy(trees[template], tmp / "probe"), cmd).allocating
    err = tmp / "stderr"
    chosen = points(total, exhaustive)
    for n in chosen:
        root = copy(trees[template], tmp / f"e{n}")
        rc = in_child(cli(root, cmd), Faults("enospc", n), err)
        lines = err.read_text().splitlines()
        errors = [line for line in lines if line.startswith("passthrough: error:")]
        assert rc in (2, 3) and len(errors) == 1, (n, lines)
        assert "No space left on device" in errors[0] and "Traceback" not in err.read_text()
        converge(root, err, want)
        shutil.rmtree(root)
    return len(chosen)


# the fast loop takes a spread of points; the exhaustive run (every point) is marked slow
def spread_and_all(names: Collection[str]) -> list[Any]:
    """(name, exhaustive) for each name: a spread of points, and every point (slow)."""
    return [
        pytest.param(
            s,
            every,
            marks=[pytest.mark.slow] if every else [],
            id=f"{s}-{'all' if every else 'spread'}",
        )
        for s in sorted(names)
        for every in (False, True)
    ]


CASES = spread_and_all(SCENARIOS)


@pytest.mark.parametrize(("scenario", "exhaustive"), CASES)
def test_sigkill_then_status_and_undo_converge(
    trees: dict[str, Path], tmp_path: Path, scenario: str, exhaustive: bool
) -> None:
    covered = kill_points(trees, tmp_path, scenario, exhaustive)
    print(f"{scenario}: {covered} kill points")
    assert covered >= 8


@pytest.mark.parametrize(("scenario", "exhaustive"), CASES)
def test_full_disk_then_status_and_undo_converge(
    trees: dict[str, Path], tmp_path: Path, scenario: str, exhaustive: bool
) -> None:
    covered = enospc_points(trees, tmp_path, scenario, exhaustive)
    print(f"{scenario}: {covered} ENOSPC points")
    assert covered >= 5


def _limited(limit: int, fn: Callable[[], int]) -> Callable[[], int]:
    def run() -> int:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        return fn()

    return run


@pytest.mark.parametrize("limit", [0, 150, 1000, 2000, 3000, 3800])
def test_a_real_short_write_is_caught_and_nothing_is_lost(
    trees: dict[str, Path], tmp_path: Path, limit: int
) -> None:
    """RLIMIT_FSIZE: the kernel writes up to the limit, returns a short count, then
    refuses (EFBIG; Python ignores SIGXFSZ). The journal (3.8 KB at the end) and the files we
    write grow past the limit at different steps: nothing may be cut, undo must converge."""
    original = tree_state(trees["fresh"])
    applied = tree_state(trees["applied"])
    root = copy(trees["fresh"], tmp_path / "root")
    err = tmp_path / "stderr"
    rc = in_child(_limited(limit, cli(root, "apply")), Faults(), err)
    (error,) = [line for line in err.read_text().splitlines() if "error:" in line]
    assert rc in (2, 3) and "File too large" in error, err.read_text()
    for rel, entry in tree_state(root).items():  # each file entirely old or entirely new
        assert entry in (original.get(rel), applied.get(rel)), rel
    converge(root, err, original)


# A real SIGKILL delivered by the kernel at a real syscall: strace's fault injection on
# the command line as a user runs it (no hook involved). Counted per syscall.
STRACE_POINTS = {"rename": 16, "mkdir": 6}


@pytest.mark.parametrize(
    ("syscall", "exhaustive"),
    spread_and_all(STRACE_POINTS),
)
def test_strace_sigkill_at_a_real_syscall_then_undo_converges(
    trees: dict[str, Path], tmp_path: Path, syscall: str, exhaustive: bool
) -> None:
    original = tree_state(trees["fresh"])
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    for n in points(STRACE_POINTS[syscall], exhaustive):
        root = copy(trees["fresh"], tmp_path / f"s{n}")
        inject = f"inject={syscall}:signal=KILL:when={n}"
        argv = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", f"trace={syscall}", "-e", inject]
        run = subprocess.run(
            [*argv, sys.executable, "-m", "passthrough", "apply", "--root", str(root)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert run.returncode in (-9, 128 + 9) and "Traceback" not in run.stderr, (n, run)
        err = tmp_path / "stderr"
        err.write_text(run.stderr)
        converge(root, err, original)
        shutil.rmtree(root)


# -- several transactions: applies with an admin's edits between them, then undo ----------

DROPIN = "etc/default/grub.d/99-passthrough.cfg"
GRUB_VAR = "GRUB_CMDLINE_LINUX_DEFAULT"


def _edit_cmdline(path: Path, change: Callable[[list[str]], list[str]]) -> None:
    cmdline = path / CMDLINE
    cmdline.write_text(" ".join(change(cmdline.read_text().split())) + "\n")


def _add_module(path: Path) -> None:
    with (path / MODULES).open("a") as fh:
        fh.write("dm_crypt\n")


def _edit_dropin(path: Path) -> None:
    """Our appending line replaced by the form most guides show: ``"$VAR … nomodeset"``,
    no braces, our words in it."""
    dropin = path / DROPIN
    *header, line = dropin.read_text().rstrip("\n").split("\n")
    ours = loop_words(line)
    assert ours is not None and ours[0] == GRUB_VAR, line
    admin = f'{GRUB_VAR}="${GRUB_VAR} {" ".join(ours[1])} nomodeset"'
    dropin.write_text("\n".join([*header, admin]) + "\n")


# An admin's edits, each one that touches none of our words (so the same edit made to the
# original file gives what undo must leave: the original plus the admin's edits).
EDITS: dict[str, Callable[[Path], None]] = {
    "uuid": lambda p: _edit_cmdline(p, lambda w: ["root=UUID=ef01", *w[1:]]),
    "front": lambda p: _edit_cmdline(p, lambda w: ["mitigations=off", *w]),
    "end": lambda p: _edit_cmdline(p, lambda w: [*w, "nomodeset"]),
    "modules": lambda p: _add_module(p),
    "dropin": _edit_dropin,
}
HP2 = ("apply", "--hugepages-1g", "2")
HP4 = ("apply", "--hugepages-1g", "4")

# name: (sample host, what happened before (commands and edits), the command faulted)
HISTORY: dict[str, tuple[str, tuple[tuple[str, ...] | str, ...], tuple[str, ...]]] = {
    "pve-second-apply": ("pve-fresh", (("apply",), "uuid"), HP2),
    "pve-undo-two": ("pve-fresh", (("apply",), "uuid", HP2, "end"), ("undo",)),
    "pve-third-apply": ("pve-fresh", (("apply",), "uuid", HP2, "front"), HP4),
    "pve-undo-three": ("pve-fresh", (("apply",), "uuid", HP2, "front", HP4, "end"), ("undo",)),
    "grub-second-apply": ("fresh", (("apply",), "dropin", "modules"), HP2),
    "grub-undo-two": ("fresh", (("apply",), "dropin", HP2, "modules"), ("undo",)),
}


def _history(trees: dict[str, Path], tmp: Path, name: str) -> tuple[Path, Tree, Tree]:
    """The template (the history played on a copy), what the faulted command leaves when
    nothing goes wrong, and what undo must leave."""
    base, steps, cmd = HISTORY[name]
    root = copy(trees[base], tmp / "template")
    goal = copy(trees[base], tmp / "goal")  # the original with the admin's edits only
    for step in steps:
        if isinstance(step, str):
            EDITS[step](root)
            if base == "pve-fresh":
                EDITS[step](goal)
        else:
            assert main([*step, "--root", str(root)]) == 0
    done = copy(root, tmp / "done")
    assert main([*cmd, "--root", str(done)]) == 0
    finished = tree_state(done)
    if cmd != ("undo",):
        assert main(["undo", "--root", str(done)]) == 0
    want = tree_state(done if base == "fresh" else goal)
    if base == "fresh":  # what undo leaves, checked on its own: the admin's edits, sourced
        # (grub.d, which apply made, stays: it holds the admin's file now)
        assert diff(want, tree_state(trees["fresh"])) == [os.path.dirname(DROPIN), DROPIN, MODULES]
        assert want[MODULES][4] == (trees["fresh"] / MODULES).read_bytes() + b"dm_crypt\n"
        words = _sourced_grub(done)
        assert words == [*_sourced_grub(trees["fresh"]), "nomodeset"], words
    shutil.rmtree(done)
    return root, finished, want


def _sourced_grub(root: Path) -> list[str]:
    script = '. "$1/etc/default/grub"; for f in "$1"/etc/default/grub.d/*.cfg; do [ -e "$f" ] && . "$f"; done; echo "$GRUB_CMDLINE_LINUX $GRUB_CMDLINE_LINUX_DEFAULT"'
    run = subprocess.run(["bash", "-c", script, "bash", str(root)], capture_output=True, text=True)
    return run.stdout.split()


def history_kill_points(trees: dict[str, Path], tmp: Path, name: str, exhaustive: bool) -> int:
    """Kill the last command of a history at each point; status, then (for half the points
    of an apply) the same apply again, which must finish as an uninterrupted one did; then
    undo: the original bytes plus the admin's edits, every time."""
    template, finished, want = _history(trees, tmp, name)
    cmd = HISTORY[name][2]
    total = counted(copy(template, tmp / "probe"), *cmd).seen
    err = tmp / "stderr"
    chosen = points(total, exhaustive)
    for n in chosen:
        root = copy(template, tmp / f"k{n}")
        assert in_child(cli(root, *cmd), Faults("kill", n), err) == -9, (n, err.read_text())
        assert main(["status", "--root", str(root)]) == 0
        if cmd != ("undo",) and n % 2:
            assert main([*cmd, "--root", str(root)]) == 0, n
            assert diff(tree_state(root), finished) == [], n
        assert main(["undo", "--root", str(root)]) == 0, (n, err.read_text())
        assert diff(tree_state(root), want) == [], n
        assert temps(root) == []
        shutil.rmtree(root)
    return len(chosen)


@pytest.mark.parametrize(
    ("name", "exhaustive"),
    spread_and_all(HISTORY),
)
def test_sigkill_in_a_history_of_applies_and_edits_then_undo_converges(
    trees: dict[str, Path], tmp_path: Path, name: str, exhaustive: bool
) -> None:
    covered = history_kill_points(trees, tmp_path, name, exhaustive)
    print(f"{name}: {covered} kill points")
    assert covered >= 8
