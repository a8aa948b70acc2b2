# SPDX-License-Identifier: Apache-2.0
"""The CLI as a user meets it: exit codes, one-line errors, JSON, help, completion."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from passthrough.cli import main

from .cli_process import run_cli

PT = [sys.executable, "-m", "passthrough"]


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(args, cwd=cwd)


def test_scan_json_is_one_object_with_the_schema_tag(hosts: dict[str, Path]) -> None:
    r = run("scan", "--root", str(hosts["consumer-intel"]), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["schema"] == "passthrough.scan/v1"
    assert [g["address"] for g in data["gpus"]] == ["0000:00:02.0", "0000:01:00.0"]


def test_scan_for_people_shows_tree_and_verdicts(hosts: dict[str, Path]) -> None:
    r = run("scan", "--root", str(hosts["amd-b550-chipset"]), "--color", "never", "--topology")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "IOMMU groups" in out and "├─ group 15  GPU 0000:2b:00.0 ✘ not viable" in out
    assert "✔ 0000:2d:00.0" in out
    assert "Topology" in out
    assert "\033[" not in out


def test_scan_filters_by_address_and_refuses_unknown(hosts: dict[str, Path]) -> None:
    root = str(hosts["hgx-h100"])
    r = run("scan", "--root", root, "--json", "9a:00.0")
    assert r.returncode == 0, r.stderr
    assert [g["address"] for g in json.loads(r.stdout)["gpus"]] == ["0000:9a:00.0"]
    r = run("scan", "--root", root, "0000:99:1f.0")
    assert r.returncode == 2
    assert r.stderr.strip() == "passthrough: error: no PCI function 0000:99:1f.0 on this host"
    r = run("scan", "--root", root, "0000:1a:00.0")  # a NIC, not a GPU
    assert r.returncode == 2 and "not a function of a GPU" in r.stderr


def test_malformed_address_is_a_usage_error(hosts: dict[str, Path]) -> None:
    r = run("scan", "--root", str(hosts["hgx-h100"]), "01:00")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "malformed PCI address '01:00'" in r.stderr
    assert "Traceback" not in r.stderr


def test_check_exit_codes(hosts: dict[str, Path]) -> None:
    ok = run("check", "--root", str(hosts["consumer-intel"]))
    assert ok.returncode == 0, ok.stdout
    assert "10 passed, 0 warnings, 0 failed" in ok.stdout
    bad = run("check", "--root", str(hosts["iommu-off"]), "--json")
    assert bad.returncode == 1
    data = json.loads(bad.stdout)
    assert data["ok"] is False
    failed = {c["id"]: c for c in data["checks"] if c["level"] == "FAIL"}
    assert "iommu-enabled" in failed
    assert "intel_iommu=on" in failed["iommu-enabled"]["fix"]


@pytest.mark.parametrize(
    ("setup", "needle"),
    [
        ("missing", "no such directory"),
        ("file", "not a directory"),
        ("empty", "does not look like a host root"),
    ],
)
def test_bad_roots_get_one_line_and_exit_2(tmp_path: Path, setup: str, needle: str) -> None:
    target = tmp_path / "r"
    if setup == "file":
        target.write_text("x")
    elif setup == "empty":
        target.mkdir()
    r = run("scan", "--root", str(target))
    assert r.returncode == 2
    assert needle in r.stderr and r.stderr.count("\n") == 1
    assert r.stdout == ""


def _copy(src: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "copy"
    shutil.copytree(src, dest, symlinks=True)
    return dest


def test_malformed_attribute_names_the_file(hosts: dict[str, Path], tmp_path: Path) -> None:
    root = _copy(hosts["consumer-intel"], tmp_path)
    dev = root / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"
    (dev / "uevent").write_text("DRIVER=nvidia\nPCI_CLASS=30000\nPCI_ID=10DE:GPU!\n")
    r = run("scan", "--root", str(root))
    assert r.returncode == 2
    assert "0000:01:00.0/uevent: expected a hex number, got 'GPU!'" in r.stderr
    assert "Traceback" not in r.stderr
    # without uevent the attribute files are read, and named when broken
    (dev / "uevent").unlink()
    (dev / "vendor").write_text("nvidia?\n")
    r = run("scan", "--root", str(root))
    assert r.returncode == 2
    assert "0000:01:00.0/vendor: expected a hex number, got 'nvidia?'" in r.stderr


def test_without_uevent_attribute_files_give_the_same_report(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    root = _copy(hosts["two-gpus-one-group"], tmp_path)
    before = run("scan", "--root", str(root), "--json")
    for uevent in root.glob("sys/devices/**/uevent"):
        uevent.unlink()
    after = run("scan", "--root", str(root), "--json")
    assert after.returncode == 0, after.stderr
    assert json.loads(after.stdout)["gpus"] == json.loads(before.stdout)["gpus"]


def test_malformed_resource_file_names_the_file(hosts: dict[str, Path], tmp_path: Path) -> None:
    root = _copy(hosts["consumer-intel"], tmp_path)
    res = root / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/resource"
    res.write_text("0x1000 zz 0x0\n")
    r = run("check", "--root", str(root))
    assert r.returncode == 2 and "resource: line 1" in r.stderr


def test_dangling_device_link_is_tolerated_and_reported(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    root = _copy(hosts["consumer-intel"], tmp_path)
    (root / "sys/bus/pci/devices/0000:07:00.0").symlink_to(
        "../../../devices/pci0000:00/gone/0000:07:00.0"
    )
    r = run("scan", "--root", str(root), "--json")
    assert r.returncode == 0, r.stderr
    problems = json.loads(r.stdout)["problems"]
    assert any("0000:07:00.0" in p and "dangling" in p for p in problems)


def test_dangling_driver_and_missing_optional_attributes_are_fine(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    root = _copy(hosts["consumer-intel"], tmp_path)
    dev = root / "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"
    for optional in (
        "numa_node",
        "boot_vga",
        "reset_method",
        "resource",
        "revision",
        "subsystem_vendor",
    ):
        (dev / optional).unlink()
    shutil.rmtree(root / "sys/bus/pci/drivers/nvidia")  # driver link now dangles
    r = run("scan", "--root", str(root), "--json")
    assert r.returncode == 0, r.stderr
    gpu = next(g for g in json.loads(r.stdout)["gpus"] if g["address"] == "0000:01:00.0")
    assert gpu["driver"] == "nvidia" and gpu["bars"] == [] and gpu["numa_node"] is None


def test_discovery_writes_nothing(hosts: dict[str, Path], tmp_path: Path) -> None:
    root = _copy(hosts["hgx-h100"], tmp_path)

    def state() -> dict[str, tuple[int, float]]:
        out = {}
        for dirpath, dirnames, filenames in os.walk(root):
            for n in dirnames + filenames:
                p = os.path.join(dirpath, n)
                st = os.lstat(p)
                out[p] = (st.st_size, st.st_mtime)
        return out

    before = state()
    for cmd in (["scan"], ["scan", "--json"], ["check"], ["scan", "--topology"]):
        assert main([*cmd, "--root", str(root)]) in (0, 1)
    assert state() == before


def test_help_teaches_and_completion_lists_commands() -> None:
    r = run("scan", "--help")
    assert r.returncode == 0 and "examples:" in r.stdout and "exit codes" in r.stdout
    r = run("completion", "bash")
    assert r.returncode == 0 and "-F _shtab_passthrough passthrough" in r.stdout
    assert "snapshot" in r.stdout and "--gpus-only" in r.stdout
    bash = shutil.which("bash")
    assert bash is not None
    # the script loads in a real bash and completes a subcommand
    probe = (
        r.stdout
        + '\nCOMP_WORDS=(passthrough sc); COMP_CWORD=1; _shtab_passthrough; echo "${COMPREPLY[@]}"\n'
    )
    out = subprocess.run([bash, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["scan"]
    # ... and a nested action, and a command's option
    for words, cword, want in (
        ("passthrough sample b", 2, ["build"]),
        ("passthrough scan --gp", 2, ["--gpus-only"]),
    ):
        probe = (
            r.stdout
            + f'\nCOMP_WORDS=({words}); COMP_CWORD={cword}; _shtab_passthrough; echo "${{COMPREPLY[@]}}"\n'
        )
        out = subprocess.run([bash, "-c", probe], capture_output=True, text=True, check=True).stdout
        assert out.split() == want, words
    r = run("completion", "zsh")
    assert (
        r.returncode == 0 and r.stdout.startswith("#compdef passthrough") and "snapshot" in r.stdout
    )


def test_unknown_option_is_usage_error() -> None:
    r = run("scan", "--bogus")
    assert r.returncode == 2 and "unrecognized arguments: --bogus" in r.stderr


def test_sample_list_and_bad_description(tmp_path: Path) -> None:
    r = run("sample", "list")
    assert r.returncode == 0 and "hgx-h100" in r.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("pci:\n  - {addr: '01:00', id: '10de:2684'}\n")
    r = run("sample", "build", str(bad), str(tmp_path / "out"))
    assert r.returncode == 2 and "malformed PCI address" in r.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("pci: [\n")
    r = run("sample", "build", str(broken), str(tmp_path / "out2"))
    assert r.returncode == 2 and "not valid YAML" in r.stderr


def test_a_directory_named_like_a_sample_does_not_hide_it(tmp_path: Path) -> None:
    """`sample build iommu-off iommu-off` (the README's way) leaves a directory of the
    sample's name: list and build still find the bundled sample; a directory given as a
    description is refused in one line."""
    assert run("sample", "build", "iommu-off", "iommu-off", cwd=tmp_path).returncode == 0
    r = run("sample", "list", "--json", cwd=tmp_path)
    assert r.returncode == 0
    assert "iommu-off" in {s["name"] for s in json.loads(r.stdout)["samples"]}
    assert run("sample", "build", "iommu-off", "again", cwd=tmp_path).returncode == 0
    (tmp_path / "descs").mkdir()
    r = run("sample", "build", "descs", "out", cwd=tmp_path)
    assert r.returncode == 2 and "descs: not a file" in r.stderr and len(r.stderr.splitlines()) == 1


def _helps(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[str, str]:
    """--help of the parser and of every subcommand below it, by command path."""
    out = {" ".join(path): parser.format_help()}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.update(_helps(sub, (*path, name)))
    return out


def test_a_command_builds_only_its_own_parser_and_says_the_same() -> None:
    """main() builds only the asked command's parser (start-up cost), and that parser, with
    its subcommands, says exactly what the whole parser says of it."""
    from passthrough.cli import COMMANDS, build_parser

    full = _helps(build_parser())
    commands = {path.split()[0] for path in full if path}
    assert commands == set(COMMANDS)
    for name in commands:
        partial = _helps(build_parser(name))
        own = {p: h for p, h in full.items() if p.split()[:1] == [name]}
        assert {p: h for p, h in partial.items() if p} == own, name
    # a wrong name, or --help before the command: the whole listing, and the listing main()
    # builds from the table alone (no command's module) says the same
    assert _helps(build_parser("scna"))[""] == full[""]
    assert _helps(build_parser("scna", listing=True))[""] == full[""]
    assert _helps(build_parser(None, listing=True))[""] == full[""]


def test_scan_imports_only_what_it_needs(hosts: dict[str, Path]) -> None:
    """The start-up goal in practice: a scan loads no other command's module, and none of
    the renderer, the validator, YAML, Jinja2, libvirt or ansible-runner."""
    probe = (
        "import sys\n"
        "from passthrough.cli import main\n"
        f"rc = main(['scan', '--root', {str(hosts['hgx-h100'])!r}, '--json'])\n"
        "print('\\n'.join(sorted(sys.modules)), file=sys.stderr)\n"
        "sys.exit(rc)\n"
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    loaded = set(r.stderr.split())
    assert json.loads(r.stdout)["schema"].startswith("passthrough.scan/")
    assert {m for m in loaded if m.startswith("passthrough.cli.")} == {
        "passthrough.cli.common",
        "passthrough.cli.scan",
    }
    unwanted = ("passthrough.vm", "passthrough.plan", "passthrough.journal", "jinja2", "yaml")
    unwanted += ("passthrough.live", "passthrough.boot", "passthrough.actions", "passthrough.kargs")
    unwanted += ("libvirt", "ansible_runner", "lxml", "shtab", "pyudev")
    assert not {m for m in loaded if m.split(".")[0] in unwanted or m.startswith(unwanted)}
    # logging only under -v; the tools' subprocess and shutil only on the live host
    assert not {"logging", "subprocess", "shutil"} & loaded


# What start-up must not load: the commands' implementations and the heavy libraries.
IMPLEMENTATION = (
    *("passthrough.plan", "passthrough.kube", "passthrough.vm", "passthrough.model"),
    *("passthrough.journal", "passthrough.live", "passthrough.boot", "passthrough.actions"),
    *("passthrough.kargs", "passthrough.analysis", "passthrough.host.discover"),
    *("passthrough.output", "passthrough.guest", "passthrough.provision", "passthrough.fakehost"),
    *("jinja2", "yaml", "libvirt", "lxml", "ansible_runner", "shtab", "pyudev", "jsonschema"),
)
# What a command's own --help may load (its flag tables), never the rest.
HEAVY = ("passthrough.model", "passthrough.journal", "passthrough.live", "passthrough.boot")
HEAVY += ("passthrough.output", "passthrough.kube.")
HEAVY += ("passthrough.vm.spec", "jinja2", "yaml", "libvirt", "lxml", "ansible_runner", "shtab")


def _imported(*argv: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run ``python -X importtime -m passthrough ARGV`` in a fresh interpreter: its result
    and every module it imported (importtime names each one on stderr)."""
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "passthrough", *argv],
        capture_output=True,
        text=True,
        check=False,
    )
    names = {
        line.split("|")[-1].strip()
        for line in r.stderr.splitlines()
        if line.startswith("import time:") and not line.rstrip().endswith("package")
    }
    return r, names


def _matches(names: set[str], prefixes: tuple[str, ...]) -> set[str]:
    return {m for m in names if m.startswith(prefixes) or m.split(".")[0] in prefixes}


@pytest.mark.parametrize("argv", [("--version",), ("--help",), ("scan", "--help"), ("bogus",)])
def test_start_up_imports_no_command_implementation(argv: tuple[str, ...]) -> None:
    """The import rule: --version, the listing, a wrong command and scan's --help import
    none of the commands' implementations (the parser is built from the table and the flag
    definitions), nor json, logging or typing (each costs more than argparse)."""
    r, names = _imported(*argv)
    assert r.returncode == (2 if argv == ("bogus",) else 0), r.stderr[-500:]
    assert "passthrough.cli" in names  # the probe sees our modules at all
    assert not _matches(names, IMPLEMENTATION)
    assert {m for m in names if m.startswith("passthrough.cli.")} <= {
        "passthrough.cli.common",
        "passthrough.cli.scan",
    }
    assert not {"json", "logging", "typing", "shutil"} & names
    if argv == ("--version",):
        assert r.stdout.strip() == "passthrough 0.1.0"


@pytest.mark.parametrize("columns", ["47", "73", "181", "", "x"])
def test_help_is_as_wide_as_argparse_makes_it(
    columns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our parser finds the terminal's width itself (argparse would import shutil for it on
    every start): the help it prints is argparse's own, byte for byte, at any $COLUMNS."""
    from passthrough.cli import build_parser
    from passthrough.cli.common import Parser

    monkeypatch.setenv("COLUMNS", columns)
    for asked in ("scan", "apply", "render"):
        ours = build_parser(asked).format_help()
        with monkeypatch.context() as m:
            m.setattr(Parser, "_get_formatter", argparse.ArgumentParser._get_formatter)
            theirs = build_parser(asked).format_help()
        assert ours == theirs
    assert ours.count("\n") > 20


def test_no_command_is_exit_2_with_its_line_on_stderr() -> None:
    """The listing on stdout, and the one line exit 2 always comes with (docs/cli.md)."""
    r = subprocess.run(
        [sys.executable, "-m", "passthrough"], capture_output=True, text=True, check=False
    )
    assert r.returncode == 2 and "scan" in r.stdout
    assert r.stderr == "passthrough: error: no command given (see the list above)\n"


@pytest.mark.parametrize("files", [["a.xml"], ["vm one.xml", "x=y.xml", "ü.xml", "validate"]])
def test_validate_with_file_names_alone_gets_the_parsers_namespace(files: list[str]) -> None:
    """``passthrough validate FILE...`` skips building the parser; what it runs with is
    what the parser would have given (every default, the same run function)."""
    from passthrough.cli import build_parser, command_module

    parsed = build_parser("validate", listing=True).parse_args(["validate", *files])
    assert vars(command_module("validate").files_only(files)) == vars(parsed)


@pytest.mark.parametrize(
    "command", ["plan", "apply", "bind", "render", "kubevirt", "vm", "validate"]
)
def test_a_commands_help_loads_its_flag_tables_only(command: str) -> None:
    """A command whose flags come from a table (plan's host options, render's VM options)
    loads that table for --help, and none of the model, renderer or libraries under it."""
    r, names = _imported(command, "--help")
    assert r.returncode == 0 and "usage: passthrough" in r.stdout
    assert not _matches(names, HEAVY)


def test_unpacked_snapshots_are_removed_on_success_and_on_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--root and --host-root archives unpack under TMPDIR; the ExitStack main() closes
    removes them whether the command succeeds, refuses after unpacking, or fails on the
    archive itself."""
    import tempfile

    from passthrough.vm.validate.main import main as validate_main

    h100 = str(Path(__file__).parent / "fixtures/h100-guest/root.tar.gz")
    xml = Path(__file__).parent / "golden/vm/consumer-2fn.xml"
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not gzip")
    unpack_here = tmp_path / "tmp"
    unpack_here.mkdir()
    monkeypatch.setenv("TMPDIR", str(unpack_here))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    for argv, rc in (
        (["scan", "--root", h100, "--json"], 0),
        (["render", "--root", h100, "--name", "g", "--gpu", "10de:9999"], 2),
        (["scan", "--root", str(bad)], 2),
    ):
        assert main(argv) == rc, argv
        assert list(unpack_here.iterdir()) == [], argv
    assert validate_main(["--host-root", h100, str(xml)]) in (0, 1)
    assert list(unpack_here.iterdir()) == []
    capsys.readouterr()


def test_archive_roots_one_folder_deep_and_errors_naming_the_archive(tmp_path: Path) -> None:
    """A root archived in one folder (`tar czf root.tar.gz root/`) is read like a snapshot;
    an archive with no root in it, or no archive at all, is named in one line (never the
    temporary directory it was unpacked to, never a message broken over lines)."""
    h100 = Path(__file__).parent / "fixtures/h100-guest/root.tar.gz"
    r = run("scan", "--root", str(h100), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["gpus"][0]["address"] == "0000:00:06.0"
    # the JSON's root is the archive the user named, not the directory it was unpacked in
    assert json.loads(r.stdout)["root"] == str(h100)
    empty = tmp_path / "empty.tar.gz"
    (tmp_path / "x/y").mkdir(parents=True)
    subprocess.run(["tar", "czf", str(empty), "-C", str(tmp_path / "x"), "."], check=True)
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not gzip")
    for archive, why in ((empty, "holds no sys/ or proc/"), (bad, "not a readable snapshot")):
        r = run("scan", "--root", str(archive))
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
        assert f"{archive}" in r.stderr and why in r.stderr and "\\n" not in r.stderr
        assert "passthrough-root-" not in r.stderr


def test_an_unknown_command_gets_the_closest_name_and_the_list() -> None:
    r = run("scna", "--root", "/")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        "passthrough: error: unknown command 'scna' (did you mean scan?); the commands: "
        "scan, check, snapshot, sample, plan, apply, undo, status, verify, bind, release, render, "
        "validate, kubevirt, vm, vgpu, provision, guest, completion, man"
    ]
    r = run("common")  # a module of the CLI package, but no command: nothing imported by name
    assert r.returncode == 2 and "unknown command 'common'" in r.stderr
    r = run("vm")
    assert r.returncode == 2 and "(seed, define, start, stop, undefine, status)" in r.stderr


# -- the CLI an admin trusts: no abbreviations, asked before the live host changes --------


def test_flags_are_never_abbreviated(hosts: dict[str, Path]) -> None:
    # `--allow` once meant --allow-boot-gpu and `--inc` --include-group, silently
    for flag in ("--allow", "--inc", "--no-iommu"):
        r = run("plan", "--root", str(hosts["consumer-intel"]), flag)
        assert r.returncode == 2, (flag, r.stdout)
        assert f"unrecognized arguments: {flag}" in r.stderr


def test_an_encoding_that_cannot_hold_a_character_gets_escapes(hosts: dict[str, Path]) -> None:
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    r = subprocess.run(
        [*PT, "scan", "--root", str(hosts["amd-b550-chipset"]), "--color", "never"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert "\\u251c\\u2500 group 15" in r.stdout  # the tree's ├─, escaped, output complete
    assert r.stdout.rstrip().splitlines()[-1]  # nothing cut at the first odd character


def test_check_summary_counts_agree_with_their_nouns(hosts: dict[str, Path]) -> None:
    r = run("check", "--root", str(hosts["iommu-off"]), "--color", "never")
    last = r.stdout.rstrip().splitlines()[-1]
    assert " 1 warnings" not in last and " 0 warning," not in last, last


def confirm_args(root: str, yes: bool = False) -> argparse.Namespace:
    return argparse.Namespace(root=root, yes=yes)


@pytest.fixture
def no_terminal(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """stdin is a real file that is no terminal (as under CI, cron or ssh without a tty)."""
    with open(os.devnull) as devnull:
        monkeypatch.setattr(sys, "stdin", devnull)
        yield


@pytest.mark.usefixtures("no_terminal")
def test_a_live_change_without_a_terminal_needs_yes() -> None:
    from passthrough.cli.common import confirm
    from passthrough.errors import NotConfirmed

    shown: list[str] = []
    with pytest.raises(NotConfirmed) as err:
        confirm(confirm_args("/"), "apply", lambda: shown.append("x") or "diff")
    assert err.value.exit_code == 2
    assert str(err.value) == (
        "apply on the live host (/): stdin is not a terminal to ask on; add --yes to go "
        "ahead; nothing was changed"
    )
    assert shown == []  # nothing shown to nobody
    confirm(confirm_args("/", yes=True), "apply", lambda: "diff")  # --yes: no question
    confirm(confirm_args("/tmp"), "apply", lambda: "diff")  # not the live root: no question


class _Terminal:
    """Stand-in for a terminal on stdin (a mock: the test process has no tty); it answers
    the question with ``answer``."""

    def __init__(self, answer: str) -> None:
        self.answer = answer

    def isatty(self) -> bool:
        return True

    def readline(self) -> str:
        return self.answer


@pytest.mark.parametrize("answer, goes_ahead", [("y\n", True), ("yes\n", True), ("\n", False)])
def test_on_a_terminal_the_change_is_shown_and_asked(
    answer: str,
    goes_ahead: bool,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from passthrough.cli.common import confirm
    from passthrough.errors import NotConfirmed

    monkeypatch.setattr(sys, "stdin", _Terminal(answer))
    if goes_ahead:
        confirm(confirm_args("/"), "undo", lambda: "the diff\n")
    else:
        with pytest.raises(NotConfirmed, match="not confirmed; nothing was changed"):
            confirm(confirm_args("/"), "undo", lambda: "the diff\n")
    err = capsys.readouterr().err
    assert err.startswith("the diff\nundo these changes on this host? [y/N] ")


@pytest.mark.parametrize(
    "argv", [["apply"], ["undo"], ["bind", "--gpu", "0000:01:00.0"]], ids=["apply", "undo", "bind"]
)
@pytest.mark.usefixtures("no_terminal")
def test_apply_undo_bind_ask_before_changing_the_live_host(
    argv: list[str], hosts: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from .conftest import tree_hash

    root = tmp_path / "host"
    shutil.copytree(hosts["consumer-intel"], root, symlinks=True)
    if argv == ["undo"]:  # something to undo: an apply made without asking (not live yet)
        assert main(["apply", "--root", str(root)]) == 0
    before = tree_hash(root)
    # the sample stands in for this machine's / (is_live is replaced: the test must not
    # change the machine it runs on)
    monkeypatch.setattr("passthrough.cli.common.is_live", lambda _root: True)
    assert main([*argv, "--root", str(root)]) == 2
    assert tree_hash(root) == before
    if argv[0] != "bind":  # bind goes on to sysfs writes a sample cannot take
        assert main([*argv, "--root", str(root), "--yes"]) == 0
        assert tree_hash(root) != before


# -- man pages: generated from the parsers, kept equal to them ----------------------------


def _example_lines(epilog: str) -> list[str]:
    """The lines under ``examples:`` in an epilog, up to the blank line after them."""
    lines = epilog.split("examples:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return [line.strip() for line in lines]


def _example_argv(line: str) -> tuple[str, list[str]]:
    """An example's program and arguments: the first command of the line, before any
    pipe, redirection or ``&&`` (a ``# comment`` dropped, as the shell drops it)."""
    words: list[str] = []
    for word in shlex.split(line, comments=True):
        if word in ("|", "&&", ">", ">>"):
            break
        words.append(word)
    if words[:3] == ["python3", "-m", "passthrough"]:
        return "passthrough", words[3:]
    return words[0], words[1:]


def test_every_help_has_examples_that_parse() -> None:
    """Every command's and subcommand's --help ends in examples (then the exit codes); each
    example is a command line the parser accepts, and at least one of them runs the very
    command whose help it is."""
    from passthrough.cli import build_parser

    top = build_parser()
    helps = _helps(top)
    assert len(helps) == 40  # the listing, 20 commands, 19 subcommands: none left out
    for path, text in helps.items():
        assert "examples:\n" in text and "exit codes:" in text, (
            f"{path or 'passthrough'}: no examples"
        )
        lines = _example_lines(text)
        assert lines, path
        runs_itself = False
        for line in lines:
            prog, argv = _example_argv(line)
            assert prog in ("passthrough", "passthrough-validate"), line
            if prog == "passthrough-validate":
                argv = ["validate", *argv]
            try:
                top.parse_args(argv)
            except SystemExit as exc:
                raise AssertionError(f"{path}: the example does not parse: {line}") from exc
            runs_itself = runs_itself or argv[: len(path.split())] == path.split()
        assert runs_itself, f"{path}: no example runs it"


def test_the_examples_on_the_sample_root_run(tmp_path: Path) -> None:
    """Every example written for the sample root (--root /tmp/hgx, the files rendered from
    it, libvirt's test driver) runs as written in a real bash, in the order a reader would
    take them, on a fresh hgx-h100 build: exit 0, or 1 where a check finds problems (the
    sample's cards are on nvidia, not vfio-pci), never an error line."""
    from passthrough.cli import build_parser

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "passthrough"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m passthrough "$@"\n')
    shim.chmod(0o755)
    hgx = tmp_path / "hgx"
    lines: list[str] = []
    for text in _helps(build_parser()).values():
        for line in _example_lines(text):
            bare = line.split("  #")[0]  # the same command, commented once, runs once
            # on the sample, or reading what was rendered from it (not rendering on /)
            on_sample = "/tmp/hgx" in line or "test:///default" in line
            on_sample = on_sample or ("gpu-vm.yaml" in line and " render " not in line)
            if on_sample and bare not in lines:
                lines.append(bare)
    if shutil.which("jq") is None:
        lines = [line for line in lines if "| jq" not in line]
    # the sample first, then what makes the files the others read
    lines.sort(key=lambda line: ("sample build" not in line, " render " not in line))
    assert len(lines) >= 15, lines
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    for line in lines:
        r = subprocess.run(
            ["bash", "-c", line.replace("/tmp/hgx", str(hgx))],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert r.returncode in (0, 1) and "error:" not in r.stderr, (line, r.stderr[-400:])


def test_man_shows_a_page_and_names_a_wrong_one(tmp_path: Path) -> None:
    """`passthrough man COMMAND` shows the page through man(1) (formatted text into a
    pipe, examples included); --roff prints the same page's source as docs/man holds it;
    a command that does not exist is one line and exit 2."""
    from passthrough.cli.manpage import pages

    r = run("man", "scan")
    assert r.returncode == 0 and "PASSTHROUGH-SCAN(1)" in r.stdout
    plain = re.sub(".\b", "", r.stdout).replace("‐", "-")
    assert "passthrough scan --gpus-only --topology" in " ".join(plain.split())
    r = run("man", "--roff", "vm")
    assert r.returncode == 0 and r.stdout == pages()["passthrough-vm.1"]
    r = run("man", "--roff")
    assert r.returncode == 0 and r.stdout == pages()["passthrough.1"]
    r = run("man", "scna")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no command 'scna'" in r.stderr


def test_man_pages_are_the_parsers_and_format_cleanly(regenerate: bool, tmp_path: Path) -> None:
    from passthrough.cli import COMMANDS
    from passthrough.cli.manpage import pages, write

    man = Path(__file__).resolve().parents[1] / "docs" / "man"
    if regenerate:
        write(man)
    got = pages()
    assert set(got) == {"passthrough.1", *(f"passthrough-{c}.1" for c in COMMANDS)}
    for name, text in got.items():
        committed = man / name
        assert committed.exists(), f"{name} missing: pytest --regenerate-golden writes docs/man"
        assert committed.read_text() == text, f"{name} differs from the parser: --regenerate-golden"
        assert "examples:" in text, f"{name}: no examples"
    written = write(tmp_path)
    for path in written:
        r = subprocess.run(
            ["groff", "-man", "-Tutf8", "-ww", "-z", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert r.returncode == 0 and r.stderr == "", (path.name, r.stderr)
    apply = subprocess.run(
        ["man", "-l", str(tmp_path / "passthrough-apply.1")],
        capture_output=True,
        text=True,
        env={**os.environ, "MANWIDTH": "100"},
        check=False,
    ).stdout
    plain = re.sub(".\b", "", apply).replace("‐", "-")  # no overstrike, no hyphen glyphs
    assert "-y, --yes" in plain and "exit codes:" in plain


def test_render_says_a_warning_once_for_every_card_it_holds(
    hosts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """The HGX's eight H100s share one NVSwitch warning: one line, the count before the
    code; --json keeps one entry per card (what each card was told)."""
    root = str(hosts["hgx-h100"])
    assert main(["render", "--root", root, "--name", "g"]) == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.endswith("[nvswitch]")]
    assert len(lines) == 1 and lines[0].endswith("(the same for 8 cards) [nvswitch]"), lines
    assert main(["render", "--root", root, "--name", "g", "--json"]) == 0
    told = json.loads(capsys.readouterr().out)["warnings"]
    assert sum(w.endswith("[nvswitch]") for w in told) == 8
