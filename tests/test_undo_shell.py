# SPDX-License-Identifier: Apache-2.0
"""Undo writes shell exactly: whatever quoting an admin used on a line of ours, the file
undo leaves sources (real bash) to the value the admin's edit meant, minus our words.

Seeded random admin lines over the quoting forms ($VAR, ${VAR}, double and single quotes,
backslash escapes, concatenations), each file sourced before and after by bash; then the
issue's cases end to end; then the kernel command line split over lines, whose words of
ours come out of every line.
"""

from __future__ import annotations

import random
import re
import subprocess
from pathlib import Path

import pytest

from passthrough.boot.grub import HEADER, VARS
from passthrough.boot.shellvars import append_missing, loop_words
from passthrough.cli import main
from passthrough.journal.drift import Ambiguous, Unpicked, unpick
from passthrough.journal.takeback import take_back

from .test_apply import changed, snapshot_tree
from .test_plan import build
from .test_undo_drift import _cmdline

VAR = "GRUB_CMDLINE_LINUX_DEFAULT"
DROPIN = "etc/default/grub.d/99-passthrough.cfg"
GRUB = "etc/default/grub"
CMDLINE = "etc/kernel/cmdline"
OURS = ["vfio-pci.ids=10de:2206,10de:1aef", "initcall_blacklist=sysfb_init"]
WRITTEN = (
    "# Written by passthrough (GPU passthrough kernel arguments); 'passthrough undo' removes it.\n"
    f'{VAR}="${{{VAR}}} {" ".join(OURS)}"\n'
)
# the drop-in as apply writes it: our appending line
LOOP_WRITTEN = HEADER + append_missing(VAR, VARS, OURS) + "\n"
# what /etc/default/grub set before the drop-in: the words an unbootable undo would lose
PRESET = "root=ZFS=rpool/ROOT/debian cryptdevice=UUID=1234:root quiet"
ADMIN_WORDS = [
    "nomodeset",
    "resume=UUID=9f2e",
    'a"b',
    "it's",
    "back\\slash",
    "$dollar",
    "#hash",
    "*glob?",
    "x=y;z",
    "{a,b}",
    "tab`tick`",
    "!bang",
    "nb\u00a0sp",  # no space to the shell (IFS is space, tab, newline): one word
]
REF = "\0REF\0"  # stands for a reference to VAR while a line is generated
SPECIAL = set(" \t\"'\\$`;&|<>()#~{}*?[]!")


def _ref(style: str, next_char: str) -> str:
    """A reference to VAR: ``$VAR`` only where the next character cannot extend the name."""
    if style == "plain" and not (next_char.isalnum() or next_char == "_"):
        return "$" + VAR
    return "${" + VAR + "}"


def _piece(rng: random.Random, text: str, style: str, after: str) -> str:
    """``text`` (references marked REF) in one quoting style, read by the shell as itself."""
    parts = text.split(REF)
    if style == "sq" and len(parts) == 1 and "'" not in text:
        return f"'{text}'"
    out = []
    for i, part in enumerate(parts):
        if style == "bare":
            out.append("".join("\\" + c if c in SPECIAL else c for c in part))
        else:
            out.append("".join("\\" + c if c in '"\\$`' else c for c in part))
        if i < len(parts) - 1:
            nxt = parts[i + 1][:1] or after
            out.append(_ref(rng.choice(["plain", "brace"]), nxt))
    body = "".join(out)
    return body if style == "bare" else f'"{body}"'


def admin_line(rng: random.Random, words: list[str]) -> str:
    """``VAR=`` and ``words`` (joined by spaces) in a random mix of quoting forms."""
    if rng.random() < 0.3:  # the most common: one double-quoted string
        return f"{VAR}=" + _piece(rng, " ".join(words), "dq", "")
    pieces: list[str] = []
    for i, word in enumerate(words):
        if i:
            pieces.append(rng.choice(['" "', "' '", "\\ ", '"  "', '" "\\ ']))
        cut = (
            sorted(rng.sample(range(1, len(word)), min(2, len(word) - 1))) if len(word) > 1 else []
        )
        chunks = [word[a:b] for a, b in zip([0, *cut], [*cut, len(word)], strict=True)]
        chunks = [c for c in chunks if c]
        # a cut inside a reference's marker would break it: keep such a word whole
        if any(c.count("\0") % 2 for c in chunks):
            chunks = [word]
        for j, chunk in enumerate(chunks):
            style = rng.choice(["dq", "sq", "bare"])
            after = chunks[j + 1][:1] if j + 1 < len(chunks) else "\0"
            pieces.append(_piece(rng, chunk, style, after if after != "\0" else " "))
    comment = rng.choice(["", "  # the admin's", " "])
    return f"{VAR}=" + "".join(pieces) + comment


def sourced(where: Path, files: list[bytes | None], preset: str = PRESET) -> list[list[str]]:
    """VAR after a real bash sources each file (VAR set to ``preset`` before): the words."""
    script = 'v="$1"; shift; for f; do ( GRUB_CMDLINE_LINUX_DEFAULT="$v"; [ -s "$f" ] && . "$f"; printf "%s\\0" "$GRUB_CMDLINE_LINUX_DEFAULT" ); done'
    paths = []
    for i, data in enumerate(files):
        path = where / f"sourced-{i}.cfg"
        path.write_bytes(data or b"")
        paths.append(str(path))
    out = subprocess.run(
        ["bash", "-c", script, "bash", preset, *paths], capture_output=True, check=True
    ).stdout
    return [[w for w in re.split("[ \t\n]+", v.decode()) if w] for v in out.split(b"\0")[:-1]]


def without_ours(words: list[str]) -> list[str]:
    return [w for w in words if w not in OURS]


@pytest.mark.parametrize("written", [WRITTEN, LOOP_WRITTEN], ids=["assignment", "loop"])
def test_admin_lines_in_every_quoting_form_source_to_their_words_minus_ours(
    tmp_path: Path, written: str
) -> None:
    """The issue's unbootable case and 300 seeded variations of it: the admin rewrites our
    drop-in's line (an assignment, or the appending loop apply writes now) into an
    assignment (re-quoted, words added, the reference to VAR in any form); undo's result,
    sourced by bash, holds every word the admin's line did except ours."""
    rng = random.Random(3030)
    checked = 0
    for _ in range(300):
        words = [REF, *OURS]
        for word in rng.sample(ADMIN_WORDS, rng.randint(1, 4)):
            if rng.random() < 0.2:
                word = REF + word  # a concatenation: ${VAR}word
            words.insert(rng.randint(0, len(words)), word)
        line = admin_line(rng, words)
        current = written.replace(written.splitlines()[-1], line).encode()
        if written == LOOP_WRITTEN:  # our loop line: takeback reads it (undo tries it first)
            got = take_back(DROPIN, b"", written.encode(), current)
        else:
            got = unpick(DROPIN, b"", written.encode(), current, OURS, [])
        assert isinstance(got, Unpicked), (line, got)
        before, after = sourced(tmp_path, [current, got.content])
        assert PRESET.split()[0] in before, line  # the admin's line appends, as ours did
        assert after == without_ours(before), (line, got.content)
        checked += 1
    assert checked == 300


def _our_line(text: str) -> tuple[str, tuple[str, ...]]:
    """Our drop-in as (the lines before our appending line, the words it lists)."""
    *header, line = text.rstrip("\n").split("\n")
    found = loop_words(line)
    assert found is not None and found[0] == VAR, line
    return "".join(h + "\n" for h in header), found[1]


def test_the_issues_line_without_braces_keeps_every_argument(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """End to end: the form most guides show, ``"$VAR … nomodeset"``. Before, undo wrote
    ``"\\$VAR nomodeset"``: a literal, every argument of /etc/default/grub dropped."""
    path = build(tmp_path, "consumer-intel", {})
    before = snapshot_tree(path)
    original = _cmdline(path)
    assert main(["apply", "--root", str(path)]) == 0
    dropin = path / DROPIN
    header, ours = _our_line(dropin.read_text())
    dropin.write_text(f'{header}{VAR}="${VAR} {" ".join(ours)} nomodeset"\n')
    assert main(["undo", "--root", str(path)]) == 0
    assert _cmdline(path).split() == [*original.split(), "nomodeset"]
    assert sourced(tmp_path, [dropin.read_bytes()], "x y") == [["x", "y", "nomodeset"]]
    assert changed(before, snapshot_tree(path)) == [DROPIN]


GRUB_BEFORE = f'GRUB_DEFAULT=0\n{VAR}="quiet iommu=off splash"\n'
GRUB_APPLIED = f'GRUB_DEFAULT=0\n{VAR}="quiet splash"\n'


def test_in_place_lines_in_every_quoting_form_merge_exactly(tmp_path: Path) -> None:
    """/etc/default/grub edited in place (apply removed iommu=off): the admin re-quotes
    the line and appends words; undo puts iommu=off back where it was, keeps theirs, and
    the file sources (bash) to exactly that."""
    rng = random.Random(3031)
    for _ in range(200):
        admin = rng.sample(ADMIN_WORDS, rng.randint(0, 3))
        line = admin_line(rng, ["quiet", "splash", *admin])
        current = GRUB_APPLIED.replace(GRUB_APPLIED.splitlines()[1], line).encode()
        got = take_back(GRUB, GRUB_BEFORE.encode(), GRUB_APPLIED.encode(), current)
        assert isinstance(got, Unpicked), (line, got)
        (after,) = sourced(tmp_path, [got.content], "")
        assert after == ["quiet", "iommu=off", "splash", *admin], (line, got.content)


@pytest.mark.parametrize(
    "value",
    [
        "$(cat /etc/x) ${GRUB_CMDLINE_LINUX_DEFAULT}",
        "`id` ${GRUB_CMDLINE_LINUX_DEFAULT}",
        "${GRUB_CMDLINE_LINUX_DEFAULT:-x}",
        "$1 ${GRUB_CMDLINE_LINUX_DEFAULT}",
    ],
)
def test_a_value_the_shell_computes_is_refused(value: str) -> None:
    """What only running the shell could tell (a command, a default, a parameter): refused
    (undo names the file), never rewritten as text."""
    line = f'{VAR}="{value} {" ".join(OURS)} nomodeset"'
    current = WRITTEN.replace(WRITTEN.splitlines()[1], line).encode()
    assert isinstance(unpick(DROPIN, b"", WRITTEN.encode(), current, OURS, []), Ambiguous)
    assert isinstance(take_back(DROPIN, b"", WRITTEN.encode(), current), Ambiguous)


# -- word lists over several lines -------------------------------------------------------

CMD_BEFORE = "root=UUID=abcd ro quiet\n"
CMD_APPLIED = "root=UUID=abcd ro quiet iommu=pt vfio-pci.ids=10de:2504\n"
ENTRY = "boot/loader/entries/abc.conf"
ENTRY_BEFORE = "title Proxmox\noptions root=/dev/sda ro quiet\nlinux /vmlinuz\n"
ENTRY_APPLIED = ENTRY_BEFORE.replace("quiet", "quiet iommu=pt vfio-pci.ids=10de:2504")


@pytest.mark.parametrize(
    ("path", "before", "applied", "admin", "want"),
    [
        (  # the issue's case: the line split in two, ours on the second
            CMDLINE,
            CMD_BEFORE,
            CMD_APPLIED,
            "root=UUID=abcd ro quiet\niommu=pt vfio-pci.ids=10de:2504 nomodeset\n",
            "root=UUID=abcd ro quiet\nnomodeset\n",
        ),
        (  # split inside ours
            CMDLINE,
            CMD_BEFORE,
            CMD_APPLIED,
            "root=UUID=abcd ro quiet iommu=pt\nvfio-pci.ids=10de:2504 nomodeset\n",
            "root=UUID=abcd ro quiet\nnomodeset\n",
        ),
        (  # a second line of only ours goes
            CMDLINE,
            CMD_BEFORE,
            CMD_APPLIED,
            "# mine\nroot=UUID=abcd ro quiet nomodeset\niommu=pt vfio-pci.ids=10de:2504\n",
            "# mine\nroot=UUID=abcd ro quiet nomodeset\n",
        ),
        (  # a loader entry with a second options line (systemd-boot joins them)
            ENTRY,
            ENTRY_BEFORE,
            ENTRY_APPLIED,
            ENTRY_BEFORE.replace("quiet", "quiet\noptions iommu=pt vfio-pci.ids=10de:2504 a=1"),
            ENTRY_BEFORE.replace("quiet", "quiet\noptions a=1"),
        ),
    ],
)
def test_our_words_come_out_of_every_line(
    path: str, before: str, applied: str, admin: str, want: str
) -> None:
    got = take_back(path, before.encode(), applied.encode(), admin.encode())
    assert got == Unpicked(want.encode())


@pytest.mark.parametrize(
    "admin",
    [
        "root=UUID=abcd ro quiet\niommu=pt vfio-pci.ids=10de:2505\n",  # ours changed
        # a word of theirs between two of ours: which side of it ours were is unknown
        "root=UUID=abcd ro quiet iommu=pt splash\nvfio-pci.ids=10de:2504\n",
    ],
)
def test_our_words_changed_on_a_split_line_are_refused(admin: str) -> None:
    got = take_back(CMDLINE, CMD_BEFORE.encode(), CMD_APPLIED.encode(), admin.encode())
    assert isinstance(got, Ambiguous)


def test_a_split_kernel_line_loses_our_words_end_to_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, undo left our arguments on the second line ("the rest is kept", exit 0):
    the card stayed on vfio-pci."""
    path = build(tmp_path, "acs-override-proxmox", {})
    cmdline = path / CMDLINE
    original = cmdline.read_text()
    assert main(["apply", "--root", str(path)]) == 0
    applied = cmdline.read_text()
    ours = applied.split()[len(original.split()) :]
    assert ours
    cmdline.write_text(original + " ".join(ours) + " nomodeset\n")
    assert main(["undo", "--root", str(path)]) == 0
    assert cmdline.read_text() == original + "nomodeset\n"


@pytest.mark.parametrize(
    "value",
    [
        f"${{{VAR}}} {OURS[0]} nomodeset",  # one of ours gone
        f"${{{VAR}}} {OURS[0]} {OURS[1]}x nomodeset",  # one of ours changed
        f"${{{VAR}}} {OURS[0]}{OURS[1]} nomodeset",  # no longer whole words
    ],
)
def test_our_loop_line_replaced_without_all_our_words_is_refused(value: str) -> None:
    """The admin's assignment in place of our appending line lacks or changed one of our
    words: what they meant by it cannot be told, undo refuses (and names the file)."""
    current = LOOP_WRITTEN.replace(LOOP_WRITTEN.splitlines()[-1], f'{VAR}="{value}"').encode()
    for got in (
        take_back(DROPIN, b"", LOOP_WRITTEN.encode(), current),
        unpick(DROPIN, b"", LOOP_WRITTEN.encode(), current, OURS, []),
    ):
        assert isinstance(got, Ambiguous), got
