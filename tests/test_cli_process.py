# SPDX-License-Identifier: Apache-2.0
"""The test harness's forked CLI (tests/cli_process.py) answers as `python -m passthrough`
does: the same exit status, standard output and standard error, for a success, a refusal,
a usage error, the help text, standard input and a working directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from .cli_process import run_cli


@pytest.mark.parametrize(
    "args",
    [
        ["scan", "--root", "{host}", "--json"],
        ["plan", "--root", "{host}", "--gpu", "0000:99:00.0"],
        ["plan", "--root", "{missing}"],
        ["scan", "--no-such-flag"],
        ["nosuch"],
        ["validate", "--help"],
        ["validate", "-"],
    ],
)
def test_the_fork_answers_as_a_new_interpreter(
    args: list[str], hosts: dict[str, Path], tmp_path: Path
) -> None:
    argv = [a.format(host=hosts["consumer-intel"], missing=tmp_path / "missing") for a in args]
    given = "<domain type='kvm'><name>x</name></domain>\n" if argv[-1] == "-" else None
    forked = run_cli(argv, input=given, cwd=tmp_path)
    fresh = run_cli(argv, input=given, cwd=tmp_path, fresh=True)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        fresh.returncode,
        fresh.stdout,
        fresh.stderr,
    )
    assert forked.stdout or forked.stderr  # each of them says something


def test_the_environment_and_temporary_directory_are_the_childs(tmp_path: Path) -> None:
    """An environment given to the child is its own (TMPDIR read afresh); one that changes
    the interpreter's own settings runs a real interpreter."""
    archive = tmp_path / "missing.tar.gz"
    r = run_cli(["scan", "--root", str(archive)], env={"TMPDIR": str(tmp_path), "PATH": "/bin"})
    assert r.returncode == 2 and str(archive) in r.stderr
    ascii_only = run_cli(["--version"], env={"PYTHONIOENCODING": "ascii", "PATH": "/bin"})
    assert ascii_only.returncode == 0 and ascii_only.stdout.startswith("passthrough ")
