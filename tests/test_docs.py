# SPDX-License-Identifier: Apache-2.0
"""Docs that cannot drift (issue 31, point 4): every relative link of README.md and docs/*.md
resolves (a heading anchor too), and every `passthrough` command line of their fenced blocks
runs, and prints what the doc quotes under it. The convention (docs/testing.md, "Command
lines in the docs"):

- a command line is a line of a fenced block that starts with ``passthrough `` once a
  ``$ `` prompt, ``sudo`` and ``.venv/bin/`` are taken off (``a && b`` and ``a; b`` are two);
- ``<!-- sample: NAME -->`` on the line above the fence runs the block's commands, in order,
  on a fresh copy of the bundled sample NAME, in a directory of their own: the copy is the
  ``--root`` (``--host-root``) of every command that takes one, in place of the one written;
  ``vm`` talks to libvirt's test driver (``test:///default``). Without it the block runs as
  written, from the repository's root (its paths are the repository's);
- in a block whose commands have a ``$ `` prompt, the lines under a command are its output:
  each must be in what it printed (stdout and stderr), ``…`` standing for any text;
- ``<!-- not run: WHY -->`` above the fence says why a block cannot run here.
"""

from __future__ import annotations

import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.cli_process import run_cli

REPO = Path(__file__).parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^ *```([a-z]*)\s*$")
MARK = re.compile(r"<!-- (sample|not run): *(.*?) *-->")
# the commands that read or change a root, and so take the sample's in its place
ROOTED = {
    "check", "scan", "plan", "apply", "undo", "status", "verify", "bind", "render",
    "snapshot", "kubevirt",
}  # fmt: skip


@dataclass
class Command:
    argv: list[str]
    output: list[str] = field(default_factory=list)


@dataclass
class Block:
    where: str
    sample: str | None
    skip: str | None
    commands: list[Command]


def _commands(line: str) -> list[list[str]] | None:
    """The passthrough commands of a line, or None when it is no command line."""
    text = line.strip()
    prompt = text.startswith("$ ")
    text = text.removeprefix("$ ")
    if not re.search(r"(^|[;&] *)(sudo )?(\.venv/bin/)?passthrough ", text):
        return [] if prompt else None
    found: list[list[str]] = []
    for part in re.split(r"&&|;", text):
        words = shlex.split(part, comments=True)
        while words and words[0] == "sudo":
            words = words[1:]
        if words and words[0].removeprefix(".venv/bin/") == "passthrough":
            found.append(words[1:])
    return found if found else ([] if prompt else None)


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        mark = MARK.search(lines[i - 1]) if i else None
        start = i
        i += 1
        commands: list[Command] = []
        prompted = False
        while i < len(lines) and not FENCE.match(lines[i]):
            line = lines[i]
            argvs = _commands(line) if not line.startswith("passthrough:") else None
            if argvs:
                prompted = prompted or line.strip().startswith("$ ")
                commands += [Command(a) for a in argvs]
            elif commands and prompted and line.strip():
                commands[-1].output.append(line.strip())
            i += 1
        i += 1
        if commands and fence[1] in ("", "sh", "console", "bash", "shell"):
            out.append(
                Block(
                    f"{path.relative_to(REPO)}:{start + 1}",
                    mark[2] if mark and mark[1] == "sample" else None,
                    mark[2] if mark and mark[1] == "not run" else None,
                    commands,
                )
            )
    return out


ALL = [b for doc in DOCS for b in blocks(doc)]
RUN = [b for b in ALL if not b.skip]
NOT_RUN = [b for b in ALL if b.skip]


def _on_sample(argv: list[str], root: str) -> list[str]:
    """The command with the sample's root in place of the one written."""
    argv = list(argv)
    for flag in ("--root", "--host-root"):
        if flag in argv:
            argv[argv.index(flag) + 1] = root
            return argv
    if argv and argv[0] in ROOTED:
        return [*argv, "--root", root]
    if argv[:1] == ["vm"] and "--connect" not in argv:
        return [*argv, "--connect", "test:///default"]
    return argv


def _quoted(line: str) -> re.Pattern[str]:
    return re.compile(".*?".join(re.escape(part) for part in line.split("…")))


@pytest.mark.parametrize("block", RUN, ids=[b.where for b in RUN])
def test_the_docs_command_lines_run_and_print_what_they_quote(
    block: Block, hosts: dict[str, Path], tmp_path: Path
) -> None:
    cwd = REPO
    root = ""
    if block.sample:
        root = str(tmp_path / "root")
        shutil.copytree(hosts[block.sample], root, symlinks=True)
        cwd = tmp_path
    for command in block.commands:
        argv = _on_sample(command.argv, root) if root else command.argv
        got = run_cli(argv, cwd=cwd, timeout=300)
        said = got.stdout + got.stderr
        assert "Traceback" not in said, (block.where, argv, said)
        errors = any("error:" in line for line in command.output)
        assert got.returncode in ((2,) if errors else (0, 1)), (block.where, argv, said)
        flat = " ".join(said.split())
        for line in command.output:
            assert _quoted(" ".join(line.split())).search(flat), (block.where, argv, line, said)


@pytest.mark.parametrize("block", NOT_RUN, ids=[b.where for b in NOT_RUN])
def test_a_block_not_run_says_why_and_names_real_commands(block: Block) -> None:
    """A block marked not run (a placeholder root, the reader's own inventory) is no test
    skipped: it must give its reason, and each command it shows must be one the program has
    (its ``--help`` answers), so a renamed command or subcommand is still caught there."""
    assert block.skip and len(block.skip.split()) >= 3, block.where
    for command in block.commands:
        words = [w for w in command.argv[:2] if not w.startswith("-")]
        got = run_cli([*words[:1], "--help"])
        if got.returncode == 0 and len(words) > 1 and words[1] in got.stdout:
            got = run_cli([*words, "--help"])
        assert got.returncode == 0, (block.where, command.argv, got.stderr)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"\[([^]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(m[1]) for m in re.finditer(r"^#+ (.*)$", path.read_text(), re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(REPO)) for d in DOCS])
def test_every_relative_link_resolves(doc: Path) -> None:
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        where, _, anchor = target.partition("#")
        path = (doc.parent / where).resolve() if where else doc
        missing = not path.exists()
        if missing or (anchor and path.suffix == ".md" and anchor not in _anchors(path)):
            broken.append(target)
    assert broken == [], doc


def test_preflight_md_is_linked_from_the_readme() -> None:
    assert "(docs/preflight.md)" in (REPO / "README.md").read_text()
