# SPDX-License-Identifier: Apache-2.0
"""Issue 19 item 3: every command printed for a person to run is one valid shell command,
the same words as the JSON ``argv`` (grubby's ``--args=a b c`` is one word, and a word
with shell syntax in it is quoted, never run).

Each text output is parsed back with ``shlex.split`` — what a POSIX shell does with the
line — and compared with the argv the JSON output gives for the same state."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from passthrough.cli import main
from passthrough.journal.status import PendingCommand, Status, TxStatus, status_text

from .test_plan import build

GPUS = ["--gpu", "01:00.0", "--gpu", "02:00.0", "--allow-boot-gpu"]


@pytest.fixture
def grubby_host(tmp_path: Path) -> Path:
    """A BLS host (grubby): its ``--args=`` word holds spaces."""
    return build(tmp_path, "two-gpus-one-group", {})


def test_plan_text_runs_the_json_argv(
    grubby_host: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = ["--root", str(grubby_host), *GPUS]
    assert main(["plan", *root, "--json"]) == 0
    argvs = [
        a["argv"] for a in json.loads(capsys.readouterr().out)["actions"] if a["kind"] == "run"
    ]
    assert main(["plan", *root]) == 0
    text = capsys.readouterr().out
    printed = [
        shlex.split(line[len("# run: ") :].rsplit(" — ", 1)[0])
        for line in text.splitlines()
        if line.startswith("# run: ")
    ]
    assert any(" " in word for argv in argvs for word in argv)  # the case that used to split
    assert printed == argvs


def test_apply_status_and_undo_print_what_json_lists(
    grubby_host: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a fixture tree commands are listed, not run: apply, status and undo each print
    them, and each printed line is the JSON argv."""
    root = ["--root", str(grubby_host)]
    assert main(["apply", *root, *GPUS]) == 0
    applied = capsys.readouterr().out
    assert main(["status", *root, "--json"]) == 0
    pending = [p["argv"] for p in json.loads(capsys.readouterr().out)["pending"]]
    assert pending and any(a[0] == "grubby" for a in pending)
    listed = [shlex.split(line) for line in applied.splitlines() if line.startswith("  ")]
    assert listed == pending
    assert main(["status", *root]) == 0
    shown = capsys.readouterr().out.split("Pending commands", 1)[1].splitlines()[1:]
    assert [shlex.split(line.rsplit("  [", 1)[0]) for line in shown] == pending
    assert main(["undo", *root, "--json"]) == 0
    owed = json.loads(capsys.readouterr().out)["commands_not_run"]
    assert owed


def test_undo_text_prints_the_json_argv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same state undone twice, once for text and once for JSON (two equal trees)."""
    one, two = (build(tmp_path / n, "two-gpus-one-group", {}) for n in ("one", "two"))
    for path in (one, two):
        assert main(["apply", "--root", str(path), *GPUS]) == 0
    capsys.readouterr()
    assert main(["undo", "--root", str(one), "--json"]) == 0
    owed = json.loads(capsys.readouterr().out)["commands_not_run"]
    assert main(["undo", "--root", str(two)]) == 0
    text = capsys.readouterr().out
    assert owed and any(" " in w for argv in owed for w in argv)
    listed = [shlex.split(line) for line in text.splitlines() if line.startswith("  ")]
    assert listed == owed


HOSTILE_WORDS = [
    "6.1.0-27-amd64;touch${IFS}X;#",
    "$(touch X)",
    "`touch X`",
    "a b\nc",
    "it's",
    "",
    "*",
]


@pytest.mark.parametrize("word", HOSTILE_WORDS)
def test_a_hostile_word_prints_quoted_and_runs_nothing(word: str, tmp_path: Path) -> None:
    """A word from the root's own files, printed in ``status``: pasted into a real shell,
    it reaches the command as one argument and nothing else runs."""
    argv = ["printf", "%s\\n", word]
    tx = TxStatus(id="t1", kind="apply", state="done", started="2026-11-23T00:00:00Z")
    pending = PendingCommand(argv, "listed", "t1", regenerate=False, error=None)
    text = status_text(Status(root=str(tmp_path), transactions=[tx], pending=[pending]))
    # the command starts on the line after the heading and may go on over lines (a quoted
    # newline); the state in brackets ends it
    rest = text.partition("Pending commands")[2].split("\n", 1)[1]
    command = rest.strip().rsplit("  [", 1)[0]
    r = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout == word + "\n"
    assert not (tmp_path / "X").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []
