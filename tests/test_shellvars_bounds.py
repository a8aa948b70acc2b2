# SPDX-License-Identifier: Apache-2.0
"""The GRUB shell reader: bounded (it always ends, and soon) and exact (what it accepts is
what a real ``bash`` and ``dash`` compute; what could set our variables unseen is refused
with the file and line). The shells run here for real."""

from __future__ import annotations

import random
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import pytest

from passthrough.boot.grub import VARS
from passthrough.boot.shellvalue import ShellVars
from passthrough.boot.shellvars import append_missing, source
from passthrough.kargs import ArgChange, UnsafeCmdline, needed

TARGET = "GRUB_CMDLINE_LINUX_DEFAULT"


@contextmanager
def within(seconds: float) -> Iterator[None]:
    """Fail (not hang) when the body runs longer than ``seconds``: a real-time timer."""

    def expired(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def read(text: str, files: dict[str, str] | None = None) -> ShellVars:
    state = ShellVars(frozenset(VARS))
    with within(10):
        source(text, "/etc/default/grub", state, (files or {}).get)
    return state


def shell(sh: str, text: str, tmp: Path, times: int = 1) -> str:
    """``TARGET`` after ``sh`` sources ``text`` ``times`` times, starting empty."""
    f = tmp / "grub"
    f.write_text(text)
    script = f'{TARGET}=""; ' + f'. "{f}"; ' * times + f'printf %s "${TARGET}"'
    return subprocess.run(
        ["env", "-i", "PATH=/usr/bin:/bin", sh, "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout


# -- bounded --------------------------------------------------------------------------


def test_backslash_blank_at_line_end_is_an_escaped_blank(tmp_path: Path) -> None:
    text = f'{TARGET}="quiet"\\ \nGRUB_TIMEOUT=5\n'
    assert read(text).value(TARGET) == "quiet " == shell("bash", text, tmp_path)


def test_a_final_backslash_at_the_end_of_the_file_stays(tmp_path: Path) -> None:
    text = f"{TARGET}=quiet\\"
    assert read(text).value(TARGET) == "quiet\\" == shell("dash", text, tmp_path)


def test_a_fan_out_of_sourced_files_is_refused_with_file_and_line() -> None:
    # each file sources the next level's file thirty times, six levels: 30**6 files, each
    # within the depth limit (hours for the reader without a total budget)
    files = {
        f"/etc/default/l{n}": "".join(f". /etc/default/l{n + 1}\n" for _ in range(30))
        for n in range(6)
    }
    files["/etc/default/l6"] = f'{TARGET}="${TARGET} x"\n'
    with pytest.raises(UnsafeCmdline, match=r"/etc/default/l\d+(:\d+)?: sourcing goes past"):
        read(". /etc/default/l0\n", files)


# -- exact: assignments not spelled as a plain name ------------------------------------

HIDDEN = 'GRUB_CMDLINE_LIN""UX_DEFAULT'  # the shell removes the quotes: one of ours


@pytest.mark.parametrize(
    "line",
    [
        f"export {HIDDEN}=iommu=off",
        f'command eval "{HIDDEN}=iommu=off"',
        f'builtin eval "{HIDDEN}=iommu=off"',
        f'\\eval "{HIDDEN}=iommu=off"',
        f'e""val "{HIDDEN}=iommu=off"',
        f"read -r {HIDDEN} <<< iommu=off",
        f"declare {HIDDEN}=iommu=off",
        f"typeset {HIDDEN}=iommu=off",
        f"printf -v {HIDDEN} %s iommu=off",
        f"mapfile -t {HIDDEN} <<< iommu=off",
    ],
)
def test_a_hidden_assignment_is_refused_with_file_and_line(line: str, tmp_path: Path) -> None:
    text = f'{TARGET}="quiet"\n{line}\n'
    assert shell("bash", text, tmp_path).startswith("iommu=off")  # bash does set it
    with pytest.raises(UnsafeCmdline, match=r"^/etc/default/grub:2: "):
        read(text)


def test_local_in_a_function_is_refused() -> None:
    with pytest.raises(UnsafeCmdline, match=r"^/etc/default/grub:1: uses local"):
        read(f"f() {{ local {HIDDEN}=iommu=off; }}\n")


def test_export_of_a_plain_name_is_still_accepted() -> None:
    assert read(f'{TARGET}="quiet"\nexport {TARGET}\n').value(TARGET) == "quiet"


# -- idempotent and minimal --------------------------------------------------------------


@pytest.mark.parametrize("sh", ["bash", "dash"])
def test_our_line_sourced_twice_appends_each_argument_once(sh: str, tmp_path: Path) -> None:
    ours = append_missing(TARGET, VARS, ["iommu=pt", "vfio-pci.ids=10de:2684"])
    text = f'{TARGET}="quiet iommu=pt"\n' + ours + "\n"
    once = shell(sh, text, tmp_path)
    assert once.split() == ["quiet", "iommu=pt", "vfio-pci.ids=10de:2684"]
    # our drop-in alone, sourced twice (an /etc/default/grub that sources grub.d itself)
    (tmp_path / "base").write_text(f'{TARGET}="quiet"\n')
    twice = shell(sh, ours + "\n", tmp_path, times=2)
    assert twice.split() == ["iommu=pt", "vfio-pci.ids=10de:2684"]
    # and the planner computes what the shells do
    assert read(text).value(TARGET) == once
    assert read(ours + "\n" + ours + "\n").value(TARGET) == twice


def test_our_line_in_a_file_sourced_twice_reads_once_in_the_planner() -> None:
    files = {"/etc/default/grub.d/99-passthrough.cfg": append_missing(TARGET, VARS, ["a=1"])}
    text = (
        f'{TARGET}="quiet"\n'
        ". /etc/default/grub.d/99-passthrough.cfg\n"
        ". /etc/default/grub.d/99-passthrough.cfg\n"
    )
    assert read(text, files).value(TARGET).split() == ["quiet", "a=1"]


def test_an_argument_the_admin_already_has_with_our_value_last_is_no_change() -> None:
    change = needed(["quiet", "iommu=1", "iommu=pt"], ArgChange(set={"iommu": "iommu=pt"}))
    assert change.is_empty()
    # not when another value comes last, and never for the huge-page keys (first wins)
    assert not needed(["iommu=pt", "iommu=1"], ArgChange(set={"iommu": "iommu=pt"})).is_empty()
    hp = ArgChange(set={"default_hugepagesz": "default_hugepagesz=1G"})
    assert not needed(["default_hugepagesz=2M", "default_hugepagesz=1G"], hp).is_empty()


# -- fuzz: random shell-ish files, each read within a time bound -----------------------

PIECES = [
    f"{TARGET}=",
    "GRUB_CMDLINE_LINUX=",
    "X=",
    '"',
    "'",
    "\\",
    "\\\n",
    "\\ \n",
    " ",
    "\t",
    "\n",
    "$",
    f"${TARGET}",
    "${GRUB_CMDLINE_LINUX}",
    "$(",
    ")",
    "`",
    ";",
    "&&",
    "#",
    "a=1",
    "quiet",
    "export ",
    "eval ",
    ". /x",
    "source /x",
    "if true; then ",
    "fi",
    "for f in 1; do ",
    "done",
    "{",
    "}",
]


def test_fuzz_the_reader_always_ends_soon_and_agrees_with_bash(tmp_path: Path) -> None:
    rng = random.Random(29)
    accepted = 0
    for n in range(400):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 14)))
        state = ShellVars(frozenset(VARS))
        try:
            with within(2):
                source(text, "/etc/default/grub", state, {"/x": f"{TARGET}=fromx\n"}.get)
        except UnsafeCmdline:
            continue
        accepted += 1
        got = subprocess.run(
            [
                "env",
                "-i",
                "PATH=/usr/bin:/bin",
                "bash",
                "-c",
                f'{TARGET}=""; . "$1"; printf %s "${TARGET}"',
                "sh",
                str(_write(tmp_path, n, text)),
            ],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if got.returncode == 0 and not got.stderr:
            assert state.value(TARGET) == got.stdout, repr(text)
    assert accepted > 20  # the generator reaches the accepting paths too


def _write(tmp: Path, n: int, text: str) -> Path:
    path = tmp / f"case{n}"
    path.write_text(text)
    return path


def test_a_loop_over_grub_d_in_default_grub_sources_each_file(tmp_path: Path) -> None:
    """Garuda's /etc/default/grub sources grub.d itself; Debian's grub-mkconfig then sources
    grub.d again: our drop-in is read twice and each argument is there once."""
    grub_d = tmp_path / "etc/default/grub.d"
    grub_d.mkdir(parents=True)
    dropin = append_missing(TARGET, VARS, ["iommu=pt"]) + "\n"
    (grub_d / "99-passthrough.cfg").write_text(dropin)
    main = (
        f'{TARGET}="quiet"\n'
        f'for g in {tmp_path}/etc/default/grub.d/*.cfg ; do if [ -e "${{g}}" ]; then '
        'source "${g}"; fi; done\n'
    )
    (tmp_path / "etc/default/grub").write_text(main)
    script = (
        f'. "{tmp_path}/etc/default/grub"; '
        f'for x in "{tmp_path}"/etc/default/grub.d/*.cfg; do . "$x"; done; printf %s "${TARGET}"'
    )
    for sh in ("bash", "dash"):
        out = subprocess.run(
            [sh, "-c", script.replace("source ", ". ")], capture_output=True, text=True
        )
        assert out.stdout.split() == ["quiet", "iommu=pt"], (sh, out)
    # the planner, reading the loop as grub-mkconfig's sysconfdir has it
    state = ShellVars(frozenset(VARS), listdir=lambda d: ["99-passthrough.cfg"])
    files = {"/etc/default/grub.d/99-passthrough.cfg": dropin}
    with within(10):
        source(
            main.replace(f"{tmp_path}/etc", "${sysconfdir}"), "/etc/default/grub", state, files.get
        )
        source(dropin, "/etc/default/grub.d/99-passthrough.cfg", state, files.get)
    assert state.value(TARGET).split() == ["quiet", "iommu=pt"]


def test_commands_inside_a_substitution_set_nothing_here(tmp_path: Path) -> None:
    """A subshell's source/eval cannot set our variables: another variable's value that
    runs one (Debian desktops set GRUB_DISTRIBUTOR so) is skipped, not refused."""
    text = (
        "GRUB_DISTRIBUTOR=`( . /etc/os-release && echo ${NAME} )`\n"
        "X=\"$(awk -F'\"' '/NAME/ {print $2}' /etc/os-release)\"\n"
        f'{TARGET}="quiet"\n'
    )
    assert read(text).value(TARGET) == "quiet" == shell("bash", text, tmp_path)
    # but a command after the substitution, in this shell, still counts
    with pytest.raises(UnsafeCmdline, match=r"^/etc/default/grub:2: uses eval"):
        read(f'Y=1\nX=`true`; eval "{HIDDEN}=x"\n')
