# SPDX-License-Identifier: Apache-2.0
"""NVSwitch functions for a guest that owns the whole NVLink domain (issue 48 item 6): the
hgx-h100 sample (8 H100 SXM5, 4 NVSwitches 10de:22a3 at da..dd:00.0) through render,
plan, apply and kubevirt render, and the partial selections each of them refuses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from passthrough import fakehost
from passthrough.cli import main

from .conftest import tree_hash

SWITCHES = ["0000:da:00.0", "0000:db:00.0", "0000:dc:00.0", "0000:dd:00.0"]


def _sources(xml: str) -> list[str]:
    return [
        f"{int(d, 16):04x}:{int(b, 16):02x}:{int(s, 16):02x}.{int(f, 16)}"
        for d, b, s, f in re.findall(
            r"<source>\s*<address domain='(\w+)' bus='(\w+)' slot='(\w+)' function='(\w+)'",
            xml,
        )
    ]


def test_render_takes_every_gpu_and_nvswitch_and_validate_passes_it(
    hosts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(hosts["hgx-h100"])
    assert main(["render", "--root", root, "--name", "nvlink", "--nvswitch", "all", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    sources = _sources(out["xml"])
    assert len(sources) == 12 and sources[-4:] == SWITCHES
    # the choice the warning asks for is made: it is no longer told
    assert not any("[nvswitch]" in w for w in out.get("warnings", []))
    domain = tmp_path / "nvlink.xml"
    domain.write_text(out["xml"])
    assert main(["validate", "--host-root", root, str(domain)]) == 0
    assert "1 valid, 0 failing" in capsys.readouterr().out
    # each switch named by address is the same selection
    by_address = [a for s in SWITCHES for a in ("--nvswitch", s[5:])]
    assert main(["render", "--root", root, "--name", "nvlink", *by_address, "--json"]) == 0
    assert _sources(json.loads(capsys.readouterr().out)["xml"]) == sources


def test_plan_binds_the_nvswitches_to_vfio_pci(
    hosts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(hosts["hgx-h100"])
    assert main(["plan", "--root", root, "--nvswitch", "all", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [c["address"] for c in plan["cards"]][-4:] == SWITCHES
    assert plan["kernel_args"]["set"] == ["vfio-pci.ids=10de:2330,10de:22a3"]
    modprobe = next(a for a in plan["actions"] if a["path"].endswith("passthrough-vfio.conf"))
    assert "+options vfio-pci ids=10de:2330,10de:22a3" in modprobe["diff"]


def test_kubevirt_render_permits_the_nvswitches(
    hosts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(hosts["hgx-h100"])
    argv = ["kubevirt", "render", "--root", root, "--name", "nvlink", "--nvswitch", "all"]
    assert main([*argv, "--json"]) == 0
    docs = json.loads(capsys.readouterr().out)["documents"]
    cr = next(d for d in docs if d["kind"] == "KubeVirt")
    permitted = cr["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]
    assert {p["pciVendorSelector"] for p in permitted} == {"10DE:2330", "10DE:22A3"}
    vm = next(d for d in docs if d["kind"] == "VirtualMachine")
    devices = vm["spec"]["template"]["spec"]["domain"]["devices"]
    switch = next(p["resourceName"] for p in permitted if p["pciVendorSelector"] == "10DE:22A3")
    # the GPUs as KubeVirt's gpus, the NVSwitches as host devices of the same VM
    assert len(devices["gpus"]) == 8
    assert [d["deviceName"] for d in devices["hostDevices"]] == [switch] * 4


PARTIAL = [
    (["--nvswitch", "da:00.0"], "1 of 4 NVSwitches"),
    (["--nvswitch", "da:00.0", "--nvswitch", "0000:db:00.0"], "2 of 4 NVSwitches"),
    (["--gpu", "18:00.0", "--nvswitch", "all"], "lacks 7 GPU(s) of the NVLink domain"),
    (["--nvswitch", "18:00.0"], "matches no NVSwitch on this host"),
]


@pytest.mark.parametrize(("args", "needle"), PARTIAL)
def test_partial_selections_are_refused_by_every_command(
    args: list[str],
    needle: str,
    hosts: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = hosts["hgx-h100"]
    before = tree_hash(root)
    out = tmp_path / "out"
    for argv in (
        ["plan", "--root", str(root)],
        ["apply", "--root", str(root), "--yes"],
        ["render", "--root", str(root), "--name", "g", "-o", str(out)],
        ["kubevirt", "render", "--root", str(root), "--name", "g", "-o", str(out)],
    ):
        assert main([*argv, *args]) == 2, argv
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, (argv, err)
        if "of" in needle:  # a real NVSwitch named, the domain split: the other mode is told
            assert "shared-NVSwitch mode" in err and "Fabric Manager on the host" in err
    assert tree_hash(root) == before and not out.exists()


def test_per_card_vms_cannot_take_the_nvswitches(
    hosts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(hosts["hgx-h100"])
    argv = ["kubevirt", "render", "--root", root, "--name", "g", "--nvswitch", "all"]
    assert main([*argv, "--per-card"]) == 2
    err = capsys.readouterr().err
    assert "--per-card splits the NVLink domain" in err and err.count("\n") == 1


def test_a_later_plan_keeps_the_nvswitches_an_apply_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The apply's record lists the NVSwitches among its cards: a plan without --nvswitch
    keeps them (nothing to change), and releasing one splits the domain (refused)."""
    root = fakehost.build(fakehost.load("hgx-h100"), tmp_path / "hgx")
    assert main(["apply", "--root", str(root), "--nvswitch", "all"]) == 0
    capsys.readouterr()
    assert main(["plan", "--root", str(root), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [c["address"] for c in plan["cards"]][-4:] == SWITCHES and not plan["changed"]
    assert main(["plan", "--root", str(root), "--release", "0000:dd:00.0"]) == 2
    assert "3 of 4 NVSwitches" in capsys.readouterr().err
