# SPDX-License-Identifier: Apache-2.0
"""Every command gives the same answer on a host root and on its snapshot: what a command
decides from the host is read by discovery (package versions included) or recorded with it
(what plan reads), so nothing is lost on the way. Real trees: every bundled sample host, and
one with a dpkg database (the versions the address planner relies on), each snapshotted by
the real ``passthrough snapshot``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from passthrough import fakehost
from passthrough.analysis.viability import find_gpus
from passthrough.cli import main
from passthrough.host.discover import discover

from .conftest import build_variant

# Debian 12's packages: what the host-with-packages sample has installed
PACKAGES = {
    "libvirt-daemon": "9.0.0-4+deb12u2",
    "qemu-system-x86": "1:7.2+dfsg-7+deb12u18",
    "ovmf": "2022.11-6+deb12u2",
}
_TEMP = re.compile(r"[^\"'\s]*passthrough-root-[A-Za-z0-9_]+")


def _run(capsys: pytest.CaptureFixture[str], root: str, argv: list[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    # the root as given (a directory, an archive) and an archive's unpacked copy read alike
    out, err = (_TEMP.sub("ROOT", t.replace(root, "ROOT")) for t in (out, err))
    return rc, out, err


def _commands(root: Path, xml: Path) -> list[list[str]]:
    """Every command that reads a host, on the default selection and on each card (the
    first four: an HGX's eight H100s are alike)."""
    r = str(root)
    cmds = [
        ["scan", "--root", r],
        ["scan", "--root", r, "--json"],
        ["scan", "--root", r, "--gpus-only", "--topology"],
        ["check", "--root", r],
        ["check", "--root", r, "--json"],
        ["plan", "--root", r],
        ["plan", "--root", r, "--json"],
        ["render", "--root", r, "--name", "parity"],
        ["render", "--root", r, "--name", "parity", "--json"],
        ["validate", "--host-root", r, str(xml)],
        ["validate", "--host-root", r, "--json", str(xml)],
    ]
    for gpu in find_gpus(discover(r))[:4]:
        card = ["--gpu", str(gpu.address)]
        cmds.append(["plan", "--root", r, *card, "--include-group", "--allow-boot-gpu"])
        cmds.append(["render", "--root", r, "--name", "parity", *card])
    return cmds


# samples with a dpkg database beside them: the versions the address planner relies on
WITH_PACKAGES = {"hgx-h100+packages": "hgx-h100", "epyc-v100+packages": "epyc-v100"}


def _parity(name: str, root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> int:
    archive = tmp_path / f"{name}.tar.gz"
    assert main(["snapshot", "--root", str(root), "-o", str(archive)]) == 0
    capsys.readouterr()
    # a domain to validate: the default render where there is one, else a hand-written
    # hostdev on the first function of the host
    xml = tmp_path / "domain.xml"
    rc = main(["render", "--root", str(root), "--name", "parity", "-o", str(xml)])
    capsys.readouterr()
    if rc != 0:
        xml.write_text(
            "<domain type='kvm'><name>p</name><memory>1048576</memory><os><type>hvm</type>"
            "</os><devices><hostdev mode='subsystem' type='pci'><source><address bus='1' "
            "slot='0'/></source></hostdev></devices></domain>"
        )
    compared = 0
    for argv in _commands(root, xml):
        on_root = _run(capsys, str(root), argv)
        snap = [str(archive) if a == str(root) else a for a in argv]
        on_snapshot = _run(capsys, str(archive), snap)
        assert on_snapshot == on_root, " ".join(argv)
        compared += 1
    return compared


# the quick tier: a desktop with two cards in one group, a shared chipset group, and a server
# with its packages; the whole sweep over every sample (the HGX with its packages too: its
# snapshot unpacks 13,000 members per command) is in the slow tier
FAST = {"two-gpus-one-group", "amd-b550-chipset", "epyc-v100+packages"}
NAMES = [*fakehost.sample_names(), *WITH_PACKAGES]


@pytest.mark.parametrize(
    "name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in NAMES]
)
def test_every_command_answers_the_same_on_the_snapshot(
    name: str, hosts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if name in WITH_PACKAGES:
        root = build_variant(tmp_path / "pk", WITH_PACKAGES[name], packages=PACKAGES)
    else:
        root = hosts[name]
    assert _parity(name, root, tmp_path, capsys) >= 11


def test_the_snapshot_keeps_the_versions_not_the_package_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """render's layout says where its versions came from: the host's dpkg database, on the
    snapshot too (not "assumed"); the snapshot's copy of that database holds only the
    packages the versions come from."""
    import tarfile

    root = build_variant(tmp_path, "hgx-h100", packages=PACKAGES)
    archive = tmp_path / "pk.tar.gz"
    assert main(["snapshot", "--root", str(root), "-o", str(archive)]) == 0
    capsys.readouterr()
    for r in (str(root), str(archive)):
        assert main(["render", "--root", r, "--name", "v", "--json"]) == 0
        out = capsys.readouterr().out
        assert '"source": "dpkg status"' in out and '"assumed": false' in out
    with tarfile.open(archive) as tar:
        member = tar.extractfile("var/lib/dpkg/status")
        assert member is not None
        status = member.read().decode()
    assert sorted(re.findall(r"^Package: (\S+)$", status, re.M)) == sorted(PACKAGES)


def test_what_the_tools_said_travels_with_the_snapshot(
    hosts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where dpkg does not say (a non-Debian live host), the versions virsh and QEMU gave
    are kept in the snapshot's metadata and read back by discovery: a root carrying them
    (written here as a live capture would) gives them to its own snapshot."""
    import json
    import shutil

    from passthrough.guest.root import SNAPSHOT_META
    from passthrough.host.snapshot import unpack
    from passthrough.vm.versions import host_versions

    root = tmp_path / "root"
    shutil.copytree(hosts["consumer-intel"], root, symlinks=True)
    meta = {"schema": "passthrough.snapshot/v1", "tool_versions": {"libvirt": "10.0.0"}}
    (root / SNAPSHOT_META).write_text(json.dumps(meta))
    archive = tmp_path / "again.tar.gz"
    assert main(["snapshot", "--root", str(root), "-o", str(archive)]) == 0
    capsys.readouterr()
    first = host_versions(discover(str(root)))
    again = host_versions(discover(unpack(str(archive), str(tmp_path / "unpacked"))))
    assert first == again
    assert first.libvirt == (10, 0) and first.source.startswith("virsh/qemu --version")
    assert first.assumed == ("qemu", "ovmf")
