# SPDX-License-Identifier: Apache-2.0
"""NVSwitch functions for a guest that owns the whole NVLink domain (issue 48 item 6): the
hgx-h100 sample (8 H100 SXM5, 4 NVSwitches 10de:22a3 at da..dd:00.0) through render,
plan, apply and kubevirt render, and the partial selections each of them refuses."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from passthrough import fakehost
from passthrough.cli import main

from .conftest import tree_hash
from .test_layout import _variant

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
        ["kubevirt", "preflight", "--root", str(root)],
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


def _bound_to_vfio(*ids: str) -> Callable[[dict[str, Any]], None]:
    """A description change: every PCI function with one of ``ids`` on vfio-pci."""

    def change(data: dict[str, Any]) -> None:
        items = list(data["pci"])
        while items:
            item = items.pop()
            items += item.get("children", [])
            if item.get("id") in ids:
                item["driver"] = "vfio-pci"

    return change


def test_kubevirt_preflight_checks_the_nvswitches_as_cards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 48: `kubevirt preflight --nvswitch all` checks a node for a VM owning the whole
    NVLink domain. Every GPU on vfio-pci, the NVSwitches still on nvidia: without the flag
    the node passes (shared-NVSwitch mode, told as the nvswitch warning); with it the four
    switches fail kube-vfio-bound and no label is given. With the switches bound too the
    node passes, labelled, the warning no longer told (the choice it asks for is made)."""
    gpus_only = _variant(tmp_path, "hgx-h100", "gpus", _bound_to_vfio("10de:2330"))
    every = _variant(tmp_path, "hgx-h100", "all", _bound_to_vfio("10de:2330", "10de:22a3"))

    def preflight(root: Path, *extra: str) -> tuple[int, dict[str, Any]]:
        code = main(["kubevirt", "preflight", "--root", str(root), "--json", *extra])
        return code, json.loads(capsys.readouterr().out)

    def ids(report: dict[str, Any], level: str) -> list[str]:
        return [c["id"] for c in report["checks"] if c["level"] == level]

    code, shared = preflight(gpus_only)
    assert code == 0 and shared["labels"], shared
    assert ids(shared, "WARN") == ["nvswitch"] * 8
    code, whole = preflight(gpus_only, "--nvswitch", "all")
    assert code == 1 and whole["labels"] == {}
    failed = [c for c in whole["checks"] if c["level"] == "FAIL"]
    assert [c["id"] for c in failed] == ["kube-vfio-bound"] * 4 + ["kube-mode-label"]
    assert [c["summary"] for c in failed[:4]] == [f"{s}: {s} on nvidia" for s in SWITCHES]
    assert "--nvswitch all" in failed[0]["fix"] and "vfio-manager" not in str(failed[-1])
    assert "nvswitch" not in ids(whole, "WARN")
    code, ready = preflight(every, "--nvswitch", "all")
    assert code == 0 and ready["labels"] == {"nvidia.com/gpu.workload.config": "vm-passthrough"}
    assert ids(ready, "WARN") == [] and ids(ready, "PASS").count("kube-vfio-bound") == 12


def test_kubevirt_preflight_leaves_the_nvswitches_out_of_the_dra_route(
    hosts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(hosts["hgx-h100"])
    argv = ["kubevirt", "preflight", "--root", root, "--route", "dra", "--nvswitch", "all"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "device-plugin route only" in err, err


@pytest.mark.fleet
def test_the_host_role_plans_the_nvswitches_as_the_cli_does(tmp_path: Path) -> None:
    """Issue 48: passthrough_host_nvswitches gives the role the CLI's --nvswitch. A partial
    selection fails the host with the reason (exit 2), its root untouched; [all] writes the
    files `apply --nvswitch all` writes on the same sample (real ansible-playbook)."""
    from passthrough.provision.runner import run, summary_table

    from .test_ansible import _inventory, _root
    from .test_fleet_rolling import _tree

    fleet, cli = _root(tmp_path, "fleet", "hgx-h100"), _root(tmp_path, "cli", "hgx-h100")
    before = _tree(fleet)
    host = {"passthrough_root": str(fleet), "passthrough_host_nvswitches": ["da:00.0"]}
    partial = run(str(_inventory(tmp_path, {"hgx": host})), "host.yml")
    reason = partial.hosts["hgx"].reason or ""
    assert not partial.ok and "1 of 4 NVSwitches" in reason, summary_table(partial)
    assert "shared-NVSwitch mode" in reason and "(exit 2)" in reason
    assert _tree(fleet) == before
    host["passthrough_host_nvswitches"] = ["all"]
    whole = run(str(_inventory(tmp_path, {"hgx": host})), "host.yml")
    assert whole.ok, summary_table(whole)
    assert main(["apply", "--root", str(cli), "--nvswitch", "all", "--yes", "--quiet"]) == 0
    # the same files under /etc (the journal under /var records its own times)
    assert _tree(fleet / "etc") == _tree(cli / "etc")
    assert "10de:22a3" in (fleet / "etc/modprobe.d/passthrough-vfio.conf").read_text()
