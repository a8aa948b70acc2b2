# SPDX-License-Identifier: Apache-2.0
"""Hostile input: archives and roots built to reach outside, and what the CLI does then.

Every case runs the real CLI in a subprocess on real files (real tar archives, real
directory trees with real symlinks) and asserts two things: the documented exit code,
and that nothing outside the root changed — the whole outside directory and the
reader-side files a link pointed at are hashed before and after.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .cli_process import run_cli

PT = [sys.executable, "-m", "passthrough"]
MARK = "outside-marker-3f1c"  # only ever written outside a root: never in an output


# -- helpers ------------------------------------------------------------------------------


def tree(path: Path) -> dict[str, str]:
    """Every entry under ``path`` (links not followed): its type, mode and content."""
    out: dict[str, str] = {}
    if not os.path.lexists(path):
        return out
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(path))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = f"link {os.readlink(p)}"
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = f"dir {oct(st.st_mode)}"
            else:
                digest = hashlib.sha256(p.read_bytes()).hexdigest()
                out[rel] = f"file {oct(st.st_mode)} {digest}"
    top = path.lstat()
    out["."] = f"top {oct(top.st_mode)} {top.st_mtime_ns}"
    return out


def reader_files() -> dict[str, str]:
    """The reading machine's own files that hostile links below point at."""
    out = {}
    for p in ("/usr/lib/os-release", "/etc/os-release", "/etc/hostname"):
        if os.path.isfile(p):
            out[p] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
    return out


def run(
    *args: str, tmp: Path | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if tmp is not None:
        env["TMPDIR"] = str(tmp)  # a snapshot unpacks here, beside `outside`
    return run_cli(args, env=env, input=stdin)


def one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in r.stderr.splitlines() if not line.startswith("  · ")]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("passthrough: error: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[Path]:
    """A directory outside every root and archive, with content worth protecting; its
    hash and the reader's files are checked unchanged after each test."""
    out = tmp_path / "outside"
    (out / "mp").mkdir(parents=True)
    (out / "mp" / "a.conf").write_text(f"# {MARK}\n")
    (out / "state").mkdir()
    (out / "secret.txt").write_text(f"{MARK}\n")
    (out / "os-release").write_text(f'ID=outside\nNAME="{MARK}"\nPRETTY_NAME="{MARK}"\n')
    (out / "grub").write_text(f'GRUB_CMDLINE_LINUX_DEFAULT="{MARK}"\n')
    before, mine = tree(out), reader_files()
    yield out
    assert tree(out) == before, "something outside the root changed"
    assert reader_files() == mine


@pytest.fixture
def root(tmp_path: Path, hosts: dict[str, Path]) -> Path:
    """A private copy of a sample host (real tree, real relative symlinks)."""
    dest = tmp_path / "root"
    shutil.copytree(hosts["consumer-intel"], dest, symlinks=True)
    return dest


def relink(path: Path, target: str) -> None:
    """Replace ``path`` (file, link or directory) by a symlink to ``target``."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def climb(link: Path, to: Path) -> str:
    """A relative target from ``link`` with far more ``..`` than its depth, then ``to``."""
    return "../" * (len(link.parts) + 5) + str(to).lstrip("/")


# -- archives: members and links that point out ----------------------------------------


def _archive(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return path


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


def _file(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode = 0o644
    return info


def _dir(name: str, mode: int = 0o777) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    return info


def _device(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.CHRTYPE
    info.devmajor, info.devminor = 1, 3  # /dev/null's numbers
    return info


HOSTILE_ARCHIVES = {
    # a link to an outside directory, then a member through it: the reported attack
    "absolute-link-then-member": lambda out: [
        (_link("d", str(out)), None),
        (_file("d/victim.txt"), b"pwned\n"),
    ],
    "relative-link-then-member": lambda out: [
        (_link("d", "../" * 40 + str(out).lstrip("/")), None),
        (_file("d/victim.txt"), b"pwned\n"),
    ],
    # an absolute link to a file outside, then a member with the link's own name
    "absolute-link-then-overwrite": lambda out: [
        (_link("s", str(out / "secret.txt")), None),
        (_file("s"), b"pwned\n"),
    ],
    # a directory member over a link to outside: extraction would chmod it
    "link-then-directory-over-it": lambda out: [
        (_link("d", str(out / "mp")), None),
        (_dir("d"), None),
    ],
    # a link inside the snapshot is fine; writing through it is not (a snapshot never does)
    "inner-link-then-member-through-it": lambda out: [
        (_dir("sub", 0o755), None),
        (_link("d", "sub"), None),
        (_file("d/x"), b"x\n"),
    ],
    "hardlink-out-then-overwrite": lambda out: [
        (_link("h", str(out / "secret.txt"), tarfile.LNKTYPE), None),
        (_file("h"), b"pwned\n"),
    ],
    "relative-hardlink-out": lambda out: [
        (_link("h", "../" * 40 + str(out / "secret.txt").lstrip("/"), tarfile.LNKTYPE), None),
    ],
    "device-node": lambda out: [(_device("dev/null"), None)],
    "dotdot-member": lambda out: [(_file("../" * 3 + "victim.txt"), b"pwned\n")],
    "absolute-member": lambda out: [(_file(str(out / "victim.txt")), b"pwned\n")],
}


@pytest.mark.parametrize("case", sorted(HOSTILE_ARCHIVES))
@pytest.mark.parametrize("command", ["scan", "validate"])
def test_hostile_archive_is_refused_and_writes_nothing_outside(
    case: str, command: str, tmp_path: Path, outside: Path
) -> None:
    unpack_here = tmp_path / "tmp"
    unpack_here.mkdir()
    evil = _archive(tmp_path / "evil.tar.gz", HOSTILE_ARCHIVES[case](outside))
    archive_before = tree(evil.parent / "evil.tar.gz")
    if command == "scan":
        r = run("scan", "--root", str(evil), tmp=unpack_here)
    else:
        xml = tmp_path / "a.xml"
        xml.write_text("<domain type='kvm'><name>x</name></domain>\n")
        r = run("validate", "--host-root", str(evil), str(xml), tmp=unpack_here)
    assert r.returncode == 2, r.stderr
    line = one_error_line(r)
    assert "unsafe member" in line
    assert not (outside / "victim.txt").exists()
    assert not (tmp_path / "victim.txt").exists()
    assert list(unpack_here.iterdir()) == []  # the unpack directory is removed too
    assert tree(evil) == archive_before


@pytest.mark.parametrize("case", sorted(HOSTILE_ARCHIVES))
def test_hostile_archive_is_refused_without_tar_filters(
    case: str, tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interpreters older than Python 3.11.4 have no extraction filters (Debian 12's own
    /usr/bin/python3 is 3.11.2, where the guest check runs): the same archives are refused
    by the toolkit's own checks there."""
    from passthrough.errors import SnapshotError
    from passthrough.host import unpack as snapshot

    monkeypatch.setattr(snapshot, "HAS_DATA_FILTER", False)
    dest = tmp_path / "dest"
    dest.mkdir()
    evil = _archive(tmp_path / "evil.tar.gz", HOSTILE_ARCHIVES[case](outside))
    with pytest.raises(SnapshotError, match="unsafe member"):
        snapshot.unpack(str(evil), str(dest))
    assert not (outside / "victim.txt").exists()
    assert not (tmp_path / "victim.txt").exists()


def test_relative_link_inside_a_snapshot_still_reads(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    """The stricter filter keeps real snapshots working: links stay, absolute ones are
    stored relative (as a chroot reads them), and scan gives the same report."""
    src = tmp_path / "root"
    shutil.copytree(hosts["consumer-intel"], src, symlinks=True)
    relink(src / "etc/os-release", "/usr/lib/os-release")  # absolute, inside the root
    archive = tmp_path / "s.tar.gz"
    assert run("snapshot", "--root", str(src), "-o", str(archive)).returncode == 0
    with tarfile.open(archive) as tar:
        links = {m.name: m.linkname for m in tar.getmembers() if m.issym()}
    assert links["etc/os-release"] == "../usr/lib/os-release"
    assert not any(t.startswith("/") for t in links.values())
    a, b = run("scan", "--root", str(src), "--json"), run("scan", "--root", str(archive), "--json")
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    da, db = json.loads(a.stdout), json.loads(b.stdout)
    da.pop("root"), db.pop("root")
    assert da == db and da["host"]["distro"]["id"] == "debian"


# -- roots whose links point out -------------------------------------------------------


@pytest.mark.parametrize("how", ["absolute", "relative"])
def test_scan_never_reads_the_readers_own_files(
    how: str, root: Path, outside: Path, tmp_path: Path
) -> None:
    (root / "usr/lib/os-release").unlink()
    link = root / "etc/os-release"
    # absolute: the reported case, /usr/lib/os-release of the machine that reads
    relink(
        link, "/usr/lib/os-release" if how == "absolute" else climb(link, outside / "os-release")
    )
    r_scan = run("scan", "--root", str(root), "--json")
    assert r_scan.returncode == 0, r_scan.stderr
    distro = json.loads(r_scan.stdout)["host"]["distro"]
    assert distro["id"] is None and distro["pretty_name"] is None  # nothing from outside
    assert MARK not in r_scan.stdout
    # the snapshot captures no outside content either
    archive = tmp_path / "s.tar.gz"
    r = run("snapshot", "--root", str(root), "-o", str(archive))
    assert r.returncode == 0, r.stderr
    with tarfile.open(archive) as tar:
        for m in tar.getmembers():
            assert not m.name.startswith(("/", "..")) and not m.linkname.startswith("/")
            f = tar.extractfile(m) if m.isfile() else None
            data = f.read() if f else b""
            assert MARK.encode() not in data, m.name
            if os.path.isfile("/usr/lib/os-release") and m.name.endswith("os-release"):
                assert data != Path("/usr/lib/os-release").read_bytes()
    # and it unpacks (every link kept inside) to the same report
    again = run("scan", "--root", str(archive), "--json")
    assert again.returncode == 0, again.stderr
    a, b = json.loads(r_scan.stdout), json.loads(again.stdout)
    a.pop("root"), b.pop("root")
    assert a == b


@pytest.mark.parametrize("how", ["absolute", "relative"])
def test_plan_reads_grub_inside_the_root_only(how: str, root: Path, outside: Path) -> None:
    link = root / "etc/default/grub"
    relink(link, str(outside / "grub") if how == "absolute" else climb(link, outside / "grub"))
    before = tree(root)
    r = run("plan", "--root", str(root), "--json")
    assert MARK not in r.stdout + r.stderr
    # the chroot-resolved file does not exist inside the root: no GRUB config to plan on
    assert r.returncode in (0, 2), r.stderr
    if r.returncode == 2:
        one_error_line(r)
    assert tree(root) == before  # reading never writes


@pytest.mark.parametrize("how", ["absolute", "relative"])
def test_apply_and_undo_write_inside_the_root_only(how: str, root: Path, outside: Path) -> None:
    """``etc/modprobe.d`` and the state directory are links out: apply writes where a
    chroot would put the files (inside the root), undo takes them away again."""
    mp, state = root / "etc/modprobe.d", root / "var/lib/passthrough"
    relink(mp, str(outside / "mp") if how == "absolute" else climb(mp, outside / "mp"))
    relink(state, str(outside / "state") if how == "absolute" else climb(state, outside / "state"))
    r = run("apply", "--root", str(root))
    assert r.returncode == 0, r.stderr
    inside = root / str(outside).lstrip("/")
    assert (inside / "mp/passthrough-vfio.conf").is_file()
    assert (inside / "state/journal.json").is_file()
    r = run("undo", "--root", str(root))
    assert r.returncode == 0, r.stderr
    assert not (inside / "mp/passthrough-vfio.conf").exists()


def test_a_link_planted_at_the_temporary_name_is_not_followed(root: Path, outside: Path) -> None:
    """apply writes ``.NAME.passthrough-tmp`` then renames it: a link already sitting
    at that name (pointing out) is replaced, never written through."""
    planted = root / "etc/modprobe.d/.passthrough-vfio.conf.passthrough-tmp"
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.symlink_to(outside / "secret.txt")
    r = run("apply", "--root", str(root))
    assert r.returncode == 0, r.stderr
    assert (root / "etc/modprobe.d/passthrough-vfio.conf").is_file()
    assert not os.path.lexists(planted)


def test_journal_paths_cannot_climb_out(root: Path, outside: Path) -> None:
    """A journal (inside the root, so as hostile as the root) naming ``../..`` paths and
    an absolute backup: undo refuses it as damaged and changes nothing, inside the root or
    out (the fixture hashes the outside)."""
    state = root / "var/lib/passthrough"
    state.mkdir(parents=True)
    up = "../" * 30 + str(outside).lstrip("/")
    (root / "bk").write_text("restored\n")
    journal = {
        "schema": "passthrough.journal/v1",
        "transactions": [
            {
                "id": "t",
                "state": "complete",
                "steps": [
                    {
                        "n": 0,
                        "state": "done",
                        "kind": "write",
                        "files": [
                            {"path": f"{up}/secret.txt", "existed": True, "backup": "/bk"},
                            {"path": f"{up}/mp/a.conf", "existed": False},
                        ],
                    }
                ],
            }
        ],
    }
    (state / "journal.json").write_text(json.dumps(journal))
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    r = run("undo", "--root", str(root))
    assert r.returncode == 2, r.stderr
    assert "journal is damaged" in one_error_line(r)
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before


def test_verify_reads_the_journal_inside_the_root(root: Path, outside: Path) -> None:
    relink(root / "var/lib/passthrough", str(outside / "state"))
    r = run("verify", "--root", str(root))
    assert r.returncode == 1, r.stderr  # nothing applied *inside* the root: checked as found
    assert "no passthrough apply in the journal" in r.stdout


def test_sysfs_link_loop_is_tolerated(root: Path, outside: Path) -> None:
    loop = root / "etc/default/grub"
    relink(loop, "/etc/default/grub")  # resolves to itself, forever
    r = run("scan", "--root", str(root), "--json")
    assert r.returncode == 0, r.stderr


# -- a snapshot root is read-only; reading and a no-op undo write nothing ---------------


@pytest.mark.parametrize(
    "argv",
    [["apply"], ["undo"], ["bind", "--gpu", "0000:01:00.0"], ["release"]],
    ids=["apply", "undo", "bind", "release"],
)
def test_snapshot_root_is_read_only(
    argv: list[str], hosts: dict[str, Path], tmp_path: Path, outside: Path
) -> None:
    archive = tmp_path / "s.tar.gz"
    assert (
        run("snapshot", "--root", str(hosts["consumer-intel"]), "-o", str(archive)).returncode == 0
    )
    before = tree(tmp_path / "s.tar.gz")
    unpack_here = tmp_path / "tmp"
    unpack_here.mkdir()
    r = run(*argv, "--root", str(archive), tmp=unpack_here)
    assert r.returncode == 2
    assert "read-only" in one_error_line(r)
    assert tree(archive) == before
    assert list(unpack_here.iterdir()) == []


def test_undo_on_a_root_never_applied_writes_nothing(tmp_path: Path, root: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run("undo", "--root", str(empty))
    assert r.returncode == 0 and "Nothing to undo" in r.stdout, r.stderr
    assert list(empty.iterdir()) == []
    before = tree(root)
    for argv in (["scan"], ["check"], ["plan"], ["undo"], ["scan", "--json"]):
        assert run(*argv, "--root", str(root)).returncode in (0, 1)
    assert tree(root) == before


# -- output: closed pipe, echoed input, -o into a missing directory ---------------------


def test_closed_pipe_exits_quietly(hosts: dict[str, Path]) -> None:
    p = subprocess.Popen(
        [*PT, "scan", "--root", str(hosts["hgx-h100"]), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # the reader is gone before the first byte (`| head -0`)
    err = p.stderr.read()
    assert p.wait() == 0
    assert err == b""


def test_closed_pipe_through_head(hosts: dict[str, Path]) -> None:
    cmd = " ".join([*PT, "scan", "--root", str(hosts["hgx-h100"]), "--json"])
    r = subprocess.run(
        ["bash", "-o", "pipefail", "-c", f"{cmd} | head -c 1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0 and r.stderr == "" and r.stdout == "{"


@pytest.mark.parametrize(
    "argv",
    [
        ["scan", "--root", "r" * 100_000],
        ["scan", "--root", "/", "Z" * 100_000],
        ["scan", "--color", "c" * 100_000],
        ["plan", "--root", "/", "--gpu", "g" * 100_000],
        ["provision", "-i", "x" * 100_000],
    ],
    ids=["root", "address", "argparse-choice", "plan-gpu", "inventory"],
)
def test_echoed_input_is_truncated(argv: list[str]) -> None:
    r = run(*argv)
    assert r.returncode == 2
    line = one_error_line(r)
    assert len(line) < 400 and "…" in line, line[:500]


def test_a_long_real_path_comes_back_whole(tmp_path: Path) -> None:
    # a path is shown whole up to PATH_MAX, so the user can copy it back: a deep temporary
    # directory passes 80 characters easily; only a longer-than-PATH_MAX value is cut
    from passthrough.errors import PATH_MAX, echo_path

    deep = tmp_path / ("d" * 120) / ("e" * 120) / "no-such-root"
    r = run("scan", "--root", str(deep))
    assert r.returncode == 2
    line = one_error_line(r)
    assert str(deep) in line and "…" not in line, line
    assert echo_path("p" * PATH_MAX).endswith("…") and len(echo_path("p" * PATH_MAX)) == 81
    assert echo_path("/a\nb") == "/a\\nb"


def test_validate_reports_an_unreadable_file_name_shortened() -> None:
    # validate reports a file it cannot read as a finding of that file (the batch goes on,
    # exit 1), and a 100 KB name is shortened in the line for people
    r = run("validate", "v" * 100_000)
    assert r.returncode == 1, r.stderr
    finding = r.stdout.splitlines()[0]
    assert "file-unreadable" in finding and "…" in finding and len(finding) < 400, finding[:500]


@pytest.mark.parametrize(
    "argv",
    [
        ["snapshot", "--root", "{root}", "-o", "{missing}/x.tar.gz"],
        ["render", "--root", "{root}", "--name", "g", "-o", "{missing}/x.xml"],
        ["vm", "seed", "--hostname", "g", "--ssh-key", "{key}", "-o", "{missing}/seed.iso"],
        ["validate", "--junit", "{missing}/r.xml", "{xml}"],
    ],
    ids=["snapshot", "render", "vm-seed", "validate-junit"],
)
def test_output_into_a_missing_directory_is_refused(
    argv: list[str], hosts: dict[str, Path], tmp_path: Path
) -> None:
    key = tmp_path / "k.pub"
    key.write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTestsOnly0000000000000000 t@h\n")
    xml = tmp_path / "a.xml"
    xml.write_text("<domain type='kvm'><name>x</name></domain>\n")
    missing = tmp_path / "no" / "such"
    values = {"root": str(hosts["consumer-intel"]), "missing": str(missing), "key": str(key)}
    values["xml"] = str(xml)
    before = tree(tmp_path)
    r = run(*[a.format(**values) for a in argv])
    assert r.returncode == 2
    assert f"no such directory {missing}" in one_error_line(r)
    assert not (tmp_path / "no").exists()
    assert tree(tmp_path) == before


# -- exit codes 3 and 4 ------------------------------------------------------------------


@pytest.mark.root  # chroot
def test_failed_regeneration_exits_3(root: Path, outside: Path) -> None:
    """A full OS tree as root runs its commands through chroot; here the tree's
    ``update-initramfs`` cannot run, so the step fails part-way: exit 3."""
    assert os.geteuid() == 0, "commands run through chroot only as root (CI runs as root)"
    for rel in ("usr/bin/env", "bin/sh"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    r = run("apply", "--root", str(root))
    assert r.returncode == 3, r.stderr
    line = one_error_line(r)
    assert "failed" in line and "passthrough undo" in line


def test_unwritable_step_exits_3(root: Path, outside: Path) -> None:
    (root / "etc/default/grub.d").write_text("a file where a directory should be\n")
    r = run("apply", "--root", str(root))
    assert r.returncode == 3
    assert "grub.d" in one_error_line(r)


def test_libvirt_failing_underneath_exits_4(tmp_path: Path) -> None:
    r = run("vm", "status", "x", "--connect", "nosuchdriver:///system")
    assert r.returncode == 4
    assert "cannot connect" in one_error_line(r)


def _local_play(tmp_path: Path, host: str, task: str) -> list[str]:
    """``provision`` argv for a one-task playbook on a local-connection host."""
    inv = tmp_path / "hosts.yml"
    inv.write_text(f"all:\n  hosts:\n    {host}:\n      ansible_connection: local\n")
    playbook = tmp_path / "play.yml"
    playbook.write_text(f"- hosts: all\n  gather_facts: false\n  tasks:\n    - {task}\n")
    return ["provision", "-i", str(inv), "--playbook", str(playbook), "--log", str(tmp_path / "l")]


def test_ansible_failing_underneath_exits_4(tmp_path: Path) -> None:
    r = run(*_local_play(tmp_path, "nowhere", "ansible.builtin.fail: {msg: failing on purpose}"))
    assert r.returncode == 4, r.stdout + r.stderr
    # progress lines come first; the error is the last line, and the only one
    errors = [line for line in r.stderr.splitlines() if line.startswith("passthrough: error:")]
    assert errors == [r.stderr.splitlines()[-1]] and "nowhere failed" in errors[0]


# -- every --help carries the exit-code table --------------------------------------------


def _commands() -> list[list[str]]:
    from passthrough.cli import build_parser

    found: list[list[str]] = [[]]

    def walk(parser: object, prefix: list[str]) -> None:
        for action in getattr(parser, "_actions", []):
            choices = getattr(action, "choices", None)
            if isinstance(choices, dict):
                for name, sub in choices.items():
                    found.append([*prefix, name])
                    walk(sub, [*prefix, name])

    walk(build_parser(), [])
    return found


def test_help_text_holds_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    from passthrough.cli import main

    for argv in _commands():
        with pytest.raises(SystemExit):
            main([*argv, "--help"])
        out = capsys.readouterr().out
        for code in ("0    ok", "3    a host step failed", "4    libvirt or Ansible", "130  "):
            assert code in out, (argv, code)


def test_interrupt_exits_130_with_one_line(tmp_path: Path) -> None:
    """Ctrl-C while a real playbook runs (a 60 s wait): one line, exit 130."""
    p = subprocess.Popen(
        [*PT, *_local_play(tmp_path, "here", "ansible.builtin.wait_for: {timeout: 60}")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: every child is ours to end
    )
    try:
        assert p.stderr is not None
        seen = ""
        while "TASK" not in seen:  # the playbook is running: our handler is in place
            line = p.stderr.readline()
            assert line, "provision ended before its task started"
            seen += line
        p.send_signal(signal.SIGINT)
        _out, err = p.communicate(timeout=60)
    finally:
        # our own process group (start_new_session): the CLI and any ansible child left
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130
    assert err.strip().splitlines()[-1] == "passthrough: error: interrupted"
    assert "Traceback" not in err


def test_undo_removes_no_directory_through_a_link_out(root: Path, outside: Path) -> None:
    """Issue 30: a journal (as hostile as the root it lies in) naming a made directory
    through an absolute link in the root. Undo resolves it inside the root, as every other
    path: the directory outside (``outside/state``, empty) stays, and the link itself is
    kept (never followed as the last component)."""
    r = run("apply", "--root", str(root))
    assert r.returncode == 0, r.stderr
    (root / "lnk").symlink_to(outside)  # absolute: the kernel would follow it out
    journal_path = root / "var/lib/passthrough/journal.json"
    journal = json.loads(journal_path.read_text())
    journal["transactions"][0]["steps"][0]["made_dirs"] = ["lnk/state", "lnk"]
    journal_path.write_text(json.dumps(journal))
    r = run("undo", "--root", str(root))
    assert r.returncode == 0, r.stderr
    assert (outside / "state").is_dir()
    assert (root / "lnk").is_symlink()
    assert not (root / "etc/modprobe.d/passthrough-vfio.conf").exists()


def test_apply_with_its_output_closed_completes_its_transaction(root: Path) -> None:
    """Issue 30: ``apply 2>&1 | head -1`` stopped apply after its first step (exit 1, no
    message, the transaction failed). Both stdout and stderr are a pipe whose reader has
    gone before the first byte: apply goes on, and the journal shows it complete."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        r = subprocess.run(
            [*PT, "apply", "--root", str(root)],
            stdout=write_end,
            stderr=write_end,
            check=False,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert r.returncode == 0
    journal = json.loads((root / "var/lib/passthrough/journal.json").read_text())
    assert [t["state"] for t in journal["transactions"]] == ["complete"]
    assert all(s["state"] in ("done", "listed") for s in journal["transactions"][0]["steps"])
    assert (root / "etc/modprobe.d/passthrough-vfio.conf").is_file()


FORGED = "update-grub\x1b[2J\x1b[H\rNo command pending.\x9b31m"


@pytest.mark.parametrize("command", ["status", "undo"])
def test_control_characters_from_a_journal_reach_no_terminal(command: str, root: Path) -> None:
    """A journal (as hostile as its root) whose pending command carries escape sequences
    that would clear the screen and print a fake all-clear: printed escaped, raw never."""
    r = run("apply", "--root", str(root))
    assert r.returncode == 0, r.stderr
    journal_path = root / "var/lib/passthrough/journal.json"
    journal = json.loads(journal_path.read_text())
    steps = journal["transactions"][0]["steps"]
    (listed,) = [s for s in steps if s.get("argv") == ["update-grub"]]
    listed["argv"] = [FORGED]
    journal_path.write_text(json.dumps(journal))
    r = run(command, "--root", str(root))
    out = r.stdout + r.stderr
    assert "\\x1b[2J\\x1b[H\\x0dNo command pending.\\u009b31m" in out, out
    assert not any(c in out for c in "\x1b\r\x9b"), repr(out)


def _with_a_real_shell(root: Path, *more: str) -> None:
    """The reading machine's own dash, env (and ``more`` of its programs) with the
    libraries they load, copied into the root: a full OS tree as far as apply can tell,
    with a shell that really runs there."""
    for binary in ("/bin/dash", "/usr/bin/env", *more):
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
        libs = [w for w in out.split() if w.startswith("/")]
        for path in (binary, *libs):
            dest = root / path.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.realpath(path), dest)
    (root / "bin/sh").unlink(missing_ok=True)
    (root / "bin/sh").symlink_to("dash")
    for mountpoint in ("proc", "dev", "sys"):
        (root / mountpoint).mkdir(exist_ok=True)


ESCAPES = (
    "/proc/1/root{out}/escaped-via-pid1",
    "/proc/self/root/../../..{out}/escaped-via-self",
)
KSM = Path("/sys/kernel/mm/ksm/pages_to_scan")  # a host knob: written, it would change
SHM = Path(f"/dev/shm/escaped-{MARK}")  # the host's /dev, as the old sandbox bound it in


@pytest.mark.root  # chroot, namespaces and mounts
def test_the_roots_own_tool_cannot_reach_outside(root: Path, outside: Path) -> None:
    """Issue 30: the image's own ``update-initramfs`` ran with the host's /proc, /sys and
    /dev bound in and wrote outside the tree through /proc/N/root. Each hostile tool
    (update-initramfs in the plain sandbox, update-grub in grub's) now tries every way out
    it has: /proc/N/root, a host /dev node (the host's /dev/shm, the disk under the tree),
    a host /sys knob, and a set-user-ID chroot and mknod (root's own way out of a chroot,
    and a disk node of its own). Every attempt it reports as done lands in
    /boot/escaped-list; there is none, the outside and the host knobs are unchanged, and
    the tool did run (its mark inside is owned by root, as the real tool's output is)."""
    assert os.geteuid() == 0, "commands run inside the tree only as root (CI runs as root)"
    _with_a_real_shell(root, "/usr/sbin/chroot", "/usr/bin/mknod")
    for setuid in ("usr/sbin/chroot", "usr/bin/mknod"):
        (root / setuid).chmod(0o4755)
    disk = subprocess.run(
        ["findmnt", "-n", "-o", "SOURCE", "-T", str(root)], capture_output=True, text=True
    ).stdout.strip()
    attempts = [e.format(out=outside) for e in ESCAPES]
    attempts += [str(SHM), str(KSM), "/sys/escaped"]
    attempts += [disk] if disk.startswith("/dev/") else []

    def tried(command: str, what: str) -> str:
        return f"if {command} 2>/dev/null; then echo '{what}' >> /boot/escaped-list; fi"

    # echo, not ":": a failed redirection of a special built-in would end the script
    script = ["#!/bin/sh", *(tried(f'echo 7 >> "{a}"', a) for a in attempts)]
    script += [
        "for p in /proc/[0-9]*; do",
        "  " + tried(f'echo x > "$p/root{outside}/escaped-via-any-pid"', "/proc/N/root"),
        "done",
        tried("/usr/sbin/chroot / /bin/sh -c true", "chroot again"),
        tried("/usr/bin/mknod /boot/disk b 8 0", "mknod"),
        "echo ran >> /boot/tool-ran",
    ]
    for name in ("update-initramfs", "update-grub"):
        tool = root / "usr/sbin" / name
        tool.parent.mkdir(parents=True, exist_ok=True)
        tool.write_text("\n".join(script) + "\n")
        tool.chmod(0o755)
    (root / "usr/bin/env").chmod(0o755)
    knob = KSM.read_text() if KSM.exists() else None
    try:
        r = run("apply", "--root", str(root))
        host_now = (KSM.read_text() if KSM.exists() else None, SHM.exists())
    finally:  # should a way out open again, the host is put back all the same
        if knob is not None and KSM.read_text() != knob:
            KSM.write_text(knob)
        SHM.unlink(missing_ok=True)
    assert host_now == (knob, False)
    assert r.returncode == 0, r.stderr
    assert (root / "boot/tool-ran").read_text() == "ran\nran\n"  # both tools ran
    assert (root / "boot/tool-ran").stat().st_uid == 0
    escaped = root / "boot/escaped-list"
    assert not escaped.exists(), escaped.read_text()
    assert not list(outside.glob("escaped-*"))


@pytest.mark.root  # a user namespace of our own whose kernel limit we may lower
def test_a_kernel_refusing_the_sandbox_lists_the_roots_tools(root: Path, outside: Path) -> None:
    """Issue 30, item 3: where the sandbox cannot be built, the root's own tools are listed
    for the admin and never run. The kernel really refuses here: apply runs as root of a
    user namespace whose limit of nested user namespaces is 0 (``user.max_user_namespaces``
    is per namespace), so the sandbox's ``unshare --user`` fails as it does in a container
    that forbids namespaces. The image's tool would leave a mark if it ran: it left none,
    and apply names the reason and the commands."""
    assert os.geteuid() == 0
    _with_a_real_shell(root)
    for name in ("update-initramfs", "update-grub"):
        tool = root / "usr/sbin" / name
        tool.parent.mkdir(parents=True, exist_ok=True)
        tool.write_text(f"#!/bin/sh\necho {name} >> /boot/tool-ran\n")
        tool.chmod(0o755)
    inner = shlex.join([*PT, "apply", "--root", str(root), "--yes"])
    limit = "echo 0 > /proc/sys/user/max_user_namespaces"
    r = subprocess.run(
        ["unshare", "--user", "--map-root-user", "sh", "-c", f"{limit} && exec {inner}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert not (root / "boot/tool-ran").exists()  # the image's code never ran
    lines = r.stdout.splitlines()
    first = lines.index(
        "Not run (this kernel refuses the user, mount and PID namespaces of the sandbox): "
        "run them inside the root first:"
    )
    assert "  update-initramfs -u -k all" in lines[first + 1 :]
    assert "  update-grub" in lines[first + 1 :]
    # and our own files were written all the same: the same transaction as elsewhere
    assert (root / "etc/modprobe.d").is_dir() and any((root / "etc/modprobe.d").iterdir())
