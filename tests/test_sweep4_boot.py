# SPDX-License-Identifier: Apache-2.0
"""The fourth hostile sweep, boot half: the next-boot read-back reads the file the
regeneration wrote, the GRUB shell reader refuses what it cannot model, huge pages are
not written blind, the upstream-GRUB block keeps the admin's lines, and a GRUB default
of any size or spelling is read in linear time without a traceback.

The sample trees are real files; where commands run (``root`` tier) they run through
chroot with this machine's real dash, and the GRUB regeneration is a **stand-in** shell
script (GRUB's own grub-mkconfig cannot probe a device here, see tests/test_nextboot.py).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from passthrough.actions import PlanRecord
from passthrough.boot import grub, readback
from passthrough.boot.grub import MARKER
from passthrough.cli import main
from passthrough.host.root import HostRoot
from passthrough.journal import nextboot
from passthrough.model import InitramfsKind

from .test_apply import snapshot_tree
from .test_nextboot import DEBIAN, grub_host, runnable
from .test_plan import build
from .test_realworld_boot import BOOT, SETTING, _rows, template

# a grub2-mkconfig stand-in (openSUSE/Fedora name; read_grub learns from its text that it
# sources /etc/default/grub only): writes its -o file, with the GRUB variables or
# (STALE_ARGS) with a fixed line that lacks ours
GRUB2 = """#! /bin/sh
set -e
sysconfdir="/etc"
if test -f "${{sysconfdir}}/default/grub" ; then
  . "${{sysconfdir}}/default/grub"
fi
out=""
while [ $# -gt 0 ]; do case "$1" in -o) out="$2"; shift 2 ;; *) shift ;; esac; done
printf 'menuentry "openSUSE" {{\\n\\tlinux\\t/boot/vmlinuz root=/dev/vda ro %s\\n}}\\n' \\
    {args} > "$out"
"""
WITH_VARS = GRUB2.format(args='"$GRUB_CMDLINE_LINUX $GRUB_CMDLINE_LINUX_DEFAULT"')
WITHOUT_OURS = GRUB2.format(args='"quiet"')
OURS = "vfio-pci.ids=10de:2684,10de:22ba"


def grub2_host(tmp_path: Path, mkconfig: str) -> Path:
    """consumer-intel as a grub2-mkconfig host (no update-grub), with a leftover
    /boot/grub/grub.cfg that has every argument the plan wants (an old install's)."""
    path = build(tmp_path, "consumer-intel", {})
    runnable(path)
    for name in ("update-grub", "grub-mkconfig"):
        (path / "usr/sbin" / name).unlink()
    (path / "usr/sbin/grub2-mkconfig").write_text(mkconfig)
    (path / "usr/sbin/grub2-mkconfig").chmod(0o755)
    (path / "boot/grub2").mkdir()
    (path / "boot/grub/grub.cfg").write_text(
        f"menuentry 'old' {{\n\tlinux /boot/vmlinuz ro quiet intel_iommu=on iommu=pt {OURS}\n}}\n"
    )
    return path


# -- 1. the read-back reads what the regeneration wrote ------------------------------------


@pytest.mark.root
def test_a_stale_grub_cfg_beside_the_regenerated_one_is_not_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """grub2-mkconfig -o /boot/grub2/grub.cfg wrote a file without our arguments: exit 5
    naming it, never "Checked /boot/grub/grub.cfg" (the leftover that has them)."""
    path = grub2_host(tmp_path, WITHOUT_OURS)
    capsys.readouterr()
    assert main(["apply", "--root", str(path)]) == 5
    out, err = capsys.readouterr()
    assert "Checked" not in out and "Reboot" not in out
    (line,) = err.strip().splitlines()[-1:]
    assert "/boot/grub2/grub.cfg (first menuentry, 'openSUSE'): " in line, line
    assert "/boot/grub/grub.cfg" not in line
    assert (
        "linux\t/boot/vmlinuz root=/dev/vda ro quiet\n"
        in (path / "boot/grub2/grub.cfg").read_text()
    )  # the stand-in really ran, through chroot


@pytest.mark.root
def test_the_regenerated_grub2_cfg_is_the_one_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = grub2_host(tmp_path, WITH_VARS)
    (path / "boot/grub/grub.cfg").write_text("menuentry 'old' {\n\tlinux /boot/vmlinuz ro\n}\n")
    capsys.readouterr()
    assert main(["apply", "--root", str(path), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["next_boot"]
    assert got["checked"] == ["/boot/grub2/grub.cfg"] and got["missing"] == []
    assert OURS in (path / "boot/grub2/grub.cfg").read_text()


@pytest.mark.parametrize(
    ("argv", "target"),
    [
        (["grub2-mkconfig", "-o", "/boot/grub2/grub.cfg"], "boot/grub2/grub.cfg"),
        (
            ["/usr/sbin/grub-mkconfig", "--output=/boot/efi/EFI/x/grub.cfg"],
            "boot/efi/EFI/x/grub.cfg",
        ),
        (["grub-mkconfig", "-o/boot/grub/grub.cfg"], "boot/grub/grub.cfg"),
        (["update-grub"], "boot/grub/grub.cfg"),
        (["grub-mkconfig"], None),  # to its standard output: nothing on disk
        (["grub-mkconfig", "-o", "grub.cfg"], None),  # relative to a directory unknown
        (["grub-mkconfig", "-o", "/boot/../etc/grub.cfg"], None),
        (["grubby", "--update-kernel=ALL"], None),
    ],
)
def test_the_target_comes_from_the_command(argv: list[str], target: str | None) -> None:
    assert grub.grub_cfg_written(argv)[0] == target


def test_where_the_target_cannot_be_told_nothing_is_checked(tmp_path: Path) -> None:
    """grub-mkconfig without -o ran: both grub.cfg files are there, neither is read."""
    path = build(tmp_path, "consumer-intel", {})
    cfg = "menuentry 'A' {\n\tlinux /boot/vmlinuz ro iommu=pt\n}\n"
    (path / "boot/grub/grub.cfg").write_text(cfg)
    (path / "boot/grub2").mkdir()
    (path / "boot/grub2/grub.cfg").write_text(cfg)
    record = PlanRecord.from_json({"kernel_args": {"set": ["iommu=pt"]}, "bootloader": "grub"})
    out = nextboot.check_record(
        HostRoot(str(path)), record, InitramfsKind.NONE_FOUND, ran=[["grub-mkconfig"]]
    )
    assert out.checked == [] and out.missing == []
    assert out.unchecked == [
        "grub.cfg (could not tell which file the regeneration wrote: "
        "grub-mkconfig ran without -o: what it wrote is not on disk)"
    ]


# -- 2, 3. the GRUB shell reader: here-documents, set options, a value spanning lines -------


def _refused(path: Path, capsys: pytest.CaptureFixture[str], where: str, what: str) -> None:
    """plan (commands only listed) and apply refuse alike: exit 2, one line naming
    ``where`` (file:line), nothing written, no traceback."""
    before = snapshot_tree(path)
    for command in ("plan", "apply"):
        capsys.readouterr()
        assert main([command, "--root", str(path)]) == 2, command
        _out, err = capsys.readouterr()
        assert err.count("\n") == 1 and where in err and what in err, err
        assert "Traceback" not in err
    assert snapshot_tree(path) == before


def _grub_file(tmp_path: Path, text: str, upstream: bool = False) -> Path:
    path = build(tmp_path, "arch-grub-desktop" if upstream else "consumer-intel", {})
    (path / "etc/default/grub").write_text(text)
    return path


HEREDOC = (
    "GRUB_DEFAULT=0\n"
    'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n'
    "cat > /dev/null <<'EOF'\n"
    "GRUB_CMDLINE_LINUX='a note\n"
    "EOF\n"
    'GRUB_CMDLINE_LINUX="intel_iommu=off"\n'
    "#'\n"
)


def test_a_here_document_is_refused_at_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its body read as lines made GRUB_CMDLINE_LINUX 'a note ... intel_iommu=off"' and hid
    the real line that boots with the IOMMU off; the plan was accepted."""
    _refused(_grub_file(tmp_path, HEREDOC), capsys, "/etc/default/grub:3", "here-document")


@pytest.mark.parametrize(
    ("line", "flag"),
    [("set -f", "-f"), ("set -u", "-u"), ("set -eu", "-u"), ("set -o nounset", "-u")],
)
def test_set_options_that_change_grub_mkconfig_are_refused_in_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, flag: str
) -> None:
    text = f'GRUB_DEFAULT=0\n{line}\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\n'
    _refused(_grub_file(tmp_path, text), capsys, "/etc/default/grub:2", f"{flag} ")


def test_set_options_that_change_nothing_stay_accepted(tmp_path: Path) -> None:
    path = _grub_file(tmp_path, 'set -e\nset +u\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
    assert main(["plan", "--root", str(path)]) == 0


@pytest.mark.parametrize("upstream", [False, True])
def test_a_kernel_line_value_spanning_lines_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], upstream: bool
) -> None:
    """grub-mkconfig writes the value into the linux line as it is: our arguments would be
    on a line GRUB runs as a command. Refused with the file and line, where commands are
    only listed too."""
    text = 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet\nsplash"\n'
    _refused(_grub_file(tmp_path, text, upstream), capsys, "/etc/default/grub:2", "spans lines")


# -- 4. huge pages against a root with no RAM figure ---------------------------------------


def test_hugepages_on_a_root_without_meminfo_needs_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = build(tmp_path, "consumer-intel", {})
    (path / "proc/meminfo").unlink()
    before = snapshot_tree(path)
    capsys.readouterr()
    assert main(["apply", "--root", str(path), "--hugepages-1g", "100000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "100000 x 1 GiB" in err and "--force" in err, err
    assert "/proc/meminfo" in err and "102400000 MiB" in err
    assert snapshot_tree(path) == before
    assert main(["apply", "--root", str(path), "--hugepages-1g", "100000", "--force"]) == 0
    err = capsys.readouterr().err
    assert "warning: 100000 x 1 GiB huge pages (102400000 MiB reserved at boot) written with" in err
    written = (path / "etc/default/grub.d/99-passthrough.cfg").read_text()
    assert "hugepages=100000" in written
    # an apply that does not ask for pages keeps them without asking again
    assert main(["apply", "--root", str(path)]) == 0


# -- 6, 7. the GRUB default: linear, any spelling, no traceback ----------------------------

CFG = "set default=\"{d}\"\nmenuentry 'A' {{\n\tlinux /boot/vmlinuz ro iommu=pt\n}}\n"


@pytest.mark.parametrize("default", ["²", "٣", "9" * 5000, "0" * 4999 + "1"])
def test_an_odd_or_huge_numeric_default_names_no_entry(default: str) -> None:
    choice = grub.choose(CFG.format(d=default), None)
    assert choice.args is None and choice.unclear is not None
    assert "names no entry" in choice.unclear and len(choice.unclear) < 200


def test_a_numeric_default_with_leading_zeros_is_still_its_place() -> None:
    assert grub.choose(CFG.format(d="000"), None).args == ["ro", "iommu=pt"]


def test_a_megabyte_saved_entry_reads_back_in_linear_time() -> None:
    """1.6 MB of saved_entry took 41 s (each step of the path built a character at a
    time); the same read-back is now a fraction of a second (bound: 5 s on a loaded
    machine). benchmarks/bench_grub_default.py shows 1/2/4/16 MiB side by side."""
    cfg = CFG.format(d="${saved_entry}")
    env = "saved_entry=" + "Advanced options>>x>" * 80_000
    start = time.perf_counter()
    choice = grub.choose(cfg, env)
    assert time.perf_counter() - start < 5
    assert choice.unclear is not None and "(1600000 chars)" in choice.unclear


def test_steps_split_as_grub_does() -> None:
    assert grub.steps("a>b>>c>>>d") == ["a", "b>c>", "d"]
    assert grub.steps("") == [""]
    assert grub.steps(">") == ["", ""]


@pytest.mark.root
@pytest.mark.parametrize("default", ["²", "9" * 5000])
def test_apply_with_an_odd_default_says_not_checked_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], default: str
) -> None:
    """update-grub wrote grub.cfg with that default; apply has written everything: it
    names the default as not checked (exit 0, no "Checked"), never a traceback."""
    standin = DEBIAN.replace(
        "printf 'menuentry",
        f"printf 'set default=\"{default}\"\\n' > /boot/grub/grub.cfg\nprintf 'menuentry",
    ).replace("> /boot/grub/grub.cfg\n", ">> /boot/grub/grub.cfg\n", 2)
    standin = standin.replace(
        f"printf 'set default=\"{default}\"\\n' >> /boot/grub/grub.cfg",
        f"printf 'set default=\"{default}\"\\n' > /boot/grub/grub.cfg",
    )
    path = grub_host(tmp_path, standin)
    capsys.readouterr()
    assert main(["apply", "--root", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Checked" not in out
    assert "Not checked: /boot/grub/grub.cfg (could not tell which entry boots: default " in out
    assert f'set default="{default}"' in (path / "boot/grub/grub.cfg").read_text()


# -- 5. the upstream-GRUB block keeps every line that is not ours ---------------------------

ABOVE, BETWEEN, BELOW = (
    "GRUB_TIMEOUT_STYLE=menu  # admin: above the marker",
    "GRUB_GFXMODE=1024x768  # admin: between the marker and our line",
    "GRUB_TERMINAL=console  # admin: just below our line",
)


def _grub_files() -> list[str]:
    if not BOOT.is_dir():
        return ["missing"]
    return [r["file"] for r in _rows() if r["kind"] == "grub"]


@pytest.mark.realworld
@pytest.mark.parametrize("name", _grub_files())
def test_a_second_apply_keeps_the_admins_lines_around_our_block(
    name: str,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each real GRUB file on an upstream-GRUB root (our block at the end of
    /etc/default/grub): an admin adds a line above our marker, one between the marker and
    our line, one below it; a second apply that changes our line keeps all three."""
    if name == "missing":
        if SETTING == "skip":
            pytest.skip(f"{BOOT} is missing and PASSTHROUGH_REALWORLD=skip")
        pytest.fail(f"{BOOT} is missing: the real-world boot tier cannot run")
    path = tmp_path / "root"
    shutil.copytree(template("iommu-off", tmp_path_factory, "upstream"), path, symlinks=True)
    grub = path / "etc/default/grub"
    shutil.copyfile(BOOT / name, grub)
    gpu = ["--gpu", "01:00.0", "--allow-boot-gpu"]
    capsys.readouterr()
    if main(["apply", "--root", str(path), *gpu]) == 2:
        # a file plan refuses for a reason of its own (tests/test_realworld_boot.py holds
        # which): one line, and nothing written, so there is no block to edit around
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and err.startswith("passthrough:"), err
        assert grub.read_bytes() == (BOOT / name).read_bytes()
        assert not (path / "var/lib/passthrough").exists()
        return
    lines = grub.read_text().split("\n")
    at = lines.index(MARKER)
    lines[at + 1 : at + 2] = [BETWEEN, lines[at + 1], BELOW]
    lines[at:at] = [ABOVE]
    grub.write_text("\n".join(lines))
    assert main(["apply", "--root", str(path), *gpu, "--hugepages-1g", "1"]) == 0, (
        capsys.readouterr().err
    )
    text = grub.read_text()
    for line in (ABOVE, BETWEEN, BELOW):
        assert text.count(line) == 1, (line, text)
    after = text.split("\n")
    assert after.count(MARKER) == 1
    ours = [ln for ln in after if ln.startswith("for _passthrough_arg in ")]
    assert len(ours) == 1 and "hugepages=1" in ours[0]
    capsys.readouterr()
    assert main(["plan", "--root", str(path), *gpu, "--hugepages-1g", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["actions"] == []


def test_a_grubenv_past_the_read_limit_is_named_not_a_refusal(tmp_path: Path) -> None:
    """After apply wrote everything, a grubenv over 16 MiB was MalformedHostData: exit 2,
    "nothing was changed", a lie. Now grub.cfg is named as not read."""
    path = build(tmp_path, "consumer-intel", {})
    (path / "boot/grub/grub.cfg").write_text(CFG.format(d="${saved_entry}"))
    (path / "boot/grub/grubenv").write_bytes(b"saved_entry=" + b"x" * (16 << 20))
    record = PlanRecord.from_json({"kernel_args": {"set": ["iommu=pt"]}, "bootloader": "grub"})
    out = readback.NextBoot(ran=[["update-grub"]])
    grub.check_grub(HostRoot(str(path)), record, out)
    assert out.checked == [] and out.missing == []
    (line,) = out.unchecked
    assert line.startswith("/boot/grub/grub.cfg (not read: ") and "16 MiB" in line
