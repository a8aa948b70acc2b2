# SPDX-License-Identifier: Apache-2.0
"""GRUB on each family, as the host's own grub-mkconfig reads its configuration.

Debian's patched grub-mkconfig sources /etc/default/grub.d/*.cfg, upstream's (Arch, openSUSE's
grub2-mkconfig, Fedora without grubby) never does. Discovery reads the root's script to
tell; where it cannot, the plan is refused with nothing written. The real Debian script is
the one installed on this machine (/usr/sbin/grub-mkconfig); upstream's is made from it at
test time by taking out the grub.d loop, as upstream's util/grub-mkconfig.in lacks it.
Sample hosts are sample trees (no binaries); the kernel line is what a real ``bash``
computes by sourcing the files the script sources.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from passthrough.boot.grub import MARKER, VARS
from passthrough.boot.shellvars import append_missing
from passthrough.host.boot import read_grub
from passthrough.host.discover import discover
from passthrough.host.root import HostRoot
from passthrough.journal.apply import apply
from passthrough.journal.undo import undo
from passthrough.model import BootloaderKind
from passthrough.plan.build import PlanOptions, make_plan

from .cli_process import run_cli
from .conftest import build_variant
from .test_apply import changed, snapshot_tree

# the lab's upstream GRUB boot makes its script with the same function (lab/ imports by bare name)
sys.path.insert(0, str(Path(__file__).parents[1] / "lab"))
from grub_upstream import upstream_mkconfig

DEBIAN_SCRIPT = Path("/usr/sbin/grub-mkconfig")


def _script(root: Path, text: str, name: str = "grub-mkconfig") -> None:
    path = root / "usr/sbin" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def debian_text() -> str:
    if not DEBIAN_SCRIPT.exists():
        pytest.fail("this machine has no /usr/sbin/grub-mkconfig (grub2-common) to read")
    return DEBIAN_SCRIPT.read_text()


def upstream_text() -> str:
    """Debian's script without its grub.d patch: upstream's reading of the configuration."""
    return upstream_mkconfig(debian_text())


def kernel_line(root: Path, dropins: bool) -> list[str]:
    """GRUB_CMDLINE_LINUX then _DEFAULT as bash has them after sourcing what the host's
    grub-mkconfig sources."""
    loop = 'for f in "$1"/etc/default/grub.d/*.cfg; do [ -e "$f" ] && . "$f"; done; '
    script = (
        '. "$1/etc/default/grub"; '
        + (loop if dropins else "")
        + 'echo "$GRUB_CMDLINE_LINUX $GRUB_CMDLINE_LINUX_DEFAULT"'
    )
    out = subprocess.run(
        ["env", "-i", "PATH=/usr/bin:/bin", "bash", "-c", script, "sh", str(root)],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


# -- reading the script ---------------------------------------------------------------


def test_the_real_debian_script_reads_grub_d(tmp_path: Path) -> None:
    _script(tmp_path, debian_text())
    grub = read_grub(HostRoot(str(tmp_path)))
    assert grub.dropins is True and grub.script == "/usr/sbin/grub-mkconfig"
    assert grub.regenerate == ("grub-mkconfig", "-o", "/boot/grub/grub.cfg")


def test_upstream_script_reads_only_default_grub(tmp_path: Path) -> None:
    _script(tmp_path, upstream_text())
    grub = read_grub(HostRoot(str(tmp_path)))
    assert grub.dropins is False and "only" in grub.why


def test_grub2_mkconfig_regenerates_boot_grub2(tmp_path: Path) -> None:
    _script(tmp_path, upstream_text(), "grub2-mkconfig")
    grub = read_grub(HostRoot(str(tmp_path)))
    assert grub.dropins is False
    assert grub.regenerate == ("grub2-mkconfig", "-o", "/boot/grub2/grub.cfg")


@pytest.mark.parametrize(
    "text",
    [
        "#!/bin/sh\n",  # reads nothing we recognise
        "\x7fELF\x02\x01\x01",  # a binary, not a script
        '#!/bin/sh\nsysconfdir="/usr/etc"\n. "${sysconfdir}/default/grub"\n',  # elsewhere
    ],
    ids=["no-source-line", "binary", "other-sysconfdir"],
)
def test_a_script_that_cannot_be_told_is_unknown(tmp_path: Path, text: str) -> None:
    _script(tmp_path, text)
    assert read_grub(HostRoot(str(tmp_path))).dropins is None


def test_update_grub_without_grub_mkconfig_cannot_be_told(tmp_path: Path) -> None:
    _script(tmp_path, "#!/bin/sh\nexec grub-mkconfig -o /boot/grub/grub.cfg\n", "update-grub")
    grub = read_grub(HostRoot(str(tmp_path)))
    assert grub.dropins is None and grub.script is None and "no grub-mkconfig" in grub.why


def test_grub2_with_bls_entries_and_no_grubby_cannot_be_told(tmp_path: Path) -> None:
    """Fedora without grubby: GRUB_ENABLE_BLSCFG=true takes the kernel line from the BLS
    entries, so a line in /etc/default/grub would be read by nothing that boots."""
    path = _host(tmp_path, "opensuse-tumbleweed")
    with (path / "etc/default/grub").open("a") as fh:
        fh.write("GRUB_ENABLE_BLSCFG=true\n")
    (path / "boot/loader/entries").mkdir(parents=True)
    (path / "boot/loader/entries/a-6.11.conf").write_text("options root=/dev/vda ro\n")
    before = snapshot_tree(path)
    out = run_cli(["apply", "--root", str(path), "--gpu", "01:00.0", "--yes"])
    assert out.returncode == 2 and "GRUB_ENABLE_BLSCFG=true" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert changed(before, snapshot_tree(path)) == []


# -- sample hosts: plan, apply, undo ------------------------------------------------------


def _host(tmp_path: Path, distro: str) -> Path:
    return build_variant(tmp_path, "consumer-intel", distro=distro)


def _apply(path: Path) -> None:
    root = HostRoot(str(path))
    plan, _ = make_plan(root, discover(str(path)), PlanOptions(gpus=("01:00.0",)))
    apply(root, plan, plan.record())


@pytest.mark.parametrize("distro", ["arch-grub", "opensuse-tumbleweed"])
def test_upstream_grub_gets_our_line_in_default_grub_and_undo_restores(
    tmp_path: Path, distro: str
) -> None:
    path = _host(tmp_path, distro)
    host = discover(str(path))
    assert host.boot.bootloader == BootloaderKind.GRUB and host.boot.grub is not None
    assert host.boot.grub.dropins is False
    main = path / "etc/default/grub"
    original = main.read_bytes()
    before = snapshot_tree(path)
    _apply(path)
    assert not (path / "etc/default/grub.d").exists()  # nothing that nothing reads
    ours = ["vfio-pci.ids=10de:2684,10de:22ba"] + (
        ["rd.driver.pre=vfio-pci"] if "suse" in distro else []
    )
    assert main.read_text().endswith(
        MARKER + "\n" + append_missing("GRUB_CMDLINE_LINUX_DEFAULT", VARS, ours) + "\n"
    )
    line = kernel_line(path, dropins=False)
    assert "vfio-pci.ids=10de:2684,10de:22ba" in line and line[0] == "quiet"
    undo(HostRoot(str(path)))
    assert main.read_bytes() == original
    assert changed(before, snapshot_tree(path)) == []


def test_the_plan_names_grub2_mkconfig_on_opensuse(tmp_path: Path) -> None:
    path = _host(tmp_path, "opensuse-tumbleweed")
    out = run_cli(["plan", "--root", str(path), "--gpu", "01:00.0", "--json"])
    assert out.returncode == 0, out.stderr
    assert "grub2-mkconfig -o /boot/grub2/grub.cfg" in " ".join(
        " ".join(a.get("argv", [])) for a in json.loads(out.stdout)["actions"]
    )


def test_an_admin_edit_after_apply_takes_effect_and_survives_undo(tmp_path: Path) -> None:
    path = _host(tmp_path, "arch-grub")
    main = path / "etc/default/grub"
    _apply(path)
    # the admin changes their own line, above ours, as they always would
    main.write_text(main.read_text().replace('DEFAULT="quiet ', 'DEFAULT="quiet splash '))
    line = kernel_line(path, dropins=False)
    assert line[:2] == ["quiet", "splash"] and "vfio-pci.ids=10de:2684,10de:22ba" in line
    undo(HostRoot(str(path)))
    text = main.read_text()
    assert MARKER not in text and "vfio-pci" not in text
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash intel_iommu=on iommu=pt"' in text


def test_a_second_plan_after_apply_is_empty_on_upstream_grub(tmp_path: Path) -> None:
    path = _host(tmp_path, "arch-grub")
    _apply(path)
    root = HostRoot(str(path))
    plan, _ = make_plan(root, discover(str(path)), PlanOptions(gpus=("01:00.0",)))
    assert plan.kernel_args.is_empty()


def test_a_script_that_cannot_be_told_refuses_and_writes_nothing(tmp_path: Path) -> None:
    path = _host(tmp_path, "arch-grub")
    (path / "usr/sbin/grub-mkconfig").write_text('#!/bin/sh\nexec /opt/grub/mkconfig "$@"\n')
    before = snapshot_tree(path)
    out = run_cli(["apply", "--root", str(path), "--gpu", "01:00.0", "--yes"])
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "/usr/sbin/grub-mkconfig does not source /etc/default/grub" in out.stderr
    assert "add vfio-pci.ids=10de:2684,10de:22ba by hand" in out.stderr
    assert changed(before, snapshot_tree(path)) == []


# -- NixOS: refused with the configuration.nix lines ----------------------------------------


def test_nixos_is_detected_and_refused_with_the_configuration_lines(tmp_path: Path) -> None:
    path = _host(tmp_path, "nixos")
    assert discover(str(path)).boot.bootloader == BootloaderKind.NIXOS
    before = snapshot_tree(path)
    for command in (["plan"], ["apply", "--yes"]):
        out = run_cli([*command, "--root", str(path), "--gpu", "01:00.0"])
        assert out.returncode == 2, out.stderr
        lines = out.stderr.splitlines()
        assert "NixOS generates /etc" in lines[0] and "configuration.nix" in lines[0]
        assert lines[1:] == [
            '  boot.kernelParams = [ "iommu=pt" "vfio-pci.ids=10de:2684,10de:22ba" ];',
            '  boot.initrd.kernelModules = [ "vfio_pci" "vfio" "vfio_iommu_type1" ];',
            "  boot.extraModprobeConfig = ''",
            "    options vfio-pci ids=10de:2684,10de:22ba",
            "    softdep nouveau pre: vfio-pci",
            "    softdep nvidia pre: vfio-pci",
            "    softdep nvidia_drm pre: vfio-pci",
            "    softdep nvidia_modeset pre: vfio-pci",
            "    softdep snd_hda_intel pre: vfio-pci",
            "  '';",
        ]
    assert changed(before, snapshot_tree(path)) == []


def test_nixos_lines_escape_what_nix_would_interpret() -> None:
    from passthrough.boot.nixos import configuration_lines
    from passthrough.kargs import ArgChange

    lines = configuration_lines(
        ArgChange(set={"a": 'a="x${y}"'}), ["intel_iommu=off"], "options m p=${x}''\n"
    )
    assert lines[0] == 'boot.kernelParams = [ "a=\\"x\\${y}\\"" ];'
    assert lines[3] == "  options m p=''${x}'''"
    assert lines[-1] == "# and take out of boot.kernelParams: intel_iommu=off"


def test_check_warns_when_grub_reading_cannot_be_told(tmp_path: Path) -> None:
    path = _host(tmp_path, "arch-grub")
    (path / "usr/sbin/grub-mkconfig").write_text("#!/bin/sh\nexec /opt/grub/mkconfig\n")
    out = run_cli(["check", "--root", str(path)])
    (line,) = [ln for ln in out.stdout.splitlines() if " bootloader " in ln]
    assert line.startswith("WARN") and "does not source /etc/default/grub" in line, line
