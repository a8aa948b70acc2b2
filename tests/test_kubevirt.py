# SPDX-License-Identifier: Apache-2.0
"""The cluster path (passthrough/kube, `passthrough kubevirt`): golden manifests for the sample
hosts, every object valid against the real APIs' schemas (KubeVirt's OpenAPI, Kubernetes'
resource.k8s.io at pinned versions, the DRA driver's opaque config), agreement with render's
libvirt domain on cards and hiding, refusals with render's codes, validate and preflight on
real sample trees.

Regenerate the goldens with ``pytest --regenerate-golden`` and review the diff.
"""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from lxml import etree

from passthrough import fakehost
from passthrough.cli import main
from passthrough.host.discover import discover
from passthrough.kube.names import plugin_name, resource_name
from passthrough.model import PciAddress
from passthrough.vm.render import render
from passthrough.vm.spec import VmOptions, build_spec

from .conftest import GOLDEN, assert_golden, tree_hash
from .kube_schemas import manifest_errors
from .test_layout import _variant, _walk

KUBE_GOLDEN = GOLDEN / "kubevirt"
# case → (sample host, render flags after --root)
CASES: dict[str, tuple[str, list[str]]] = {
    "hgx-8xh100-one-vm": (
        "hgx-h100",
        ["--name", "hgx-all", "--vcpus", "16", "--memory", "256G", "--hugepages"],
    ),
    "hgx-8xh100-per-card": (
        "hgx-h100",
        ["--name", "h100", "--vcpus", "8", "--memory", "64G", "--hugepages", "--per-card"],
    ),
    "hgx-8xh100-per-card-dra": (
        "hgx-h100",
        ["--name", "h100", "--vcpus", "8", "--memory", "64G", "--per-card", "--route", "dra"],
    ),
    "hgx-8xh100-one-vm-dra": (
        "hgx-h100",
        ["--name", "hgx-all", "--vcpus", "16", "--memory", "256G", "--route", "dra"],
    ),
    "turing-4fn": ("turing-desktop", ["--name", "rtx2080", "--vcpus", "8", "--memory", "16G"]),
    "turing-4fn-dra": (
        "turing-desktop",
        ["--name", "rtx2080", "--vcpus", "8", "--memory", "16G", "--route", "dra"],
    ),
    "turing-4fn-windows-kubevirt-plugin": (
        "turing-desktop",
        ["--name", "win11", "--profile", "windows", "--memory", "16G", "--provider", "kubevirt"],
    ),
}
# the options render gets for the same guest (for the agreement test)
RENDER_OPTS: dict[str, VmOptions] = {
    "hgx-8xh100-one-vm": VmOptions(name="hgx-all", vcpus=16, memory_mib=262144, hugepages=True),
    "hgx-8xh100-one-vm-dra": VmOptions(name="hgx-all", vcpus=16, memory_mib=262144),
    "turing-4fn": VmOptions(name="rtx2080", vcpus=8, memory_mib=16384),
    "turing-4fn-dra": VmOptions(name="rtx2080", vcpus=8, memory_mib=16384),
    "turing-4fn-windows-kubevirt-plugin": VmOptions(
        name="win11", profile="windows", memory_mib=16384
    ),
}


def _vfio_bound(data: dict[str, Any]) -> None:
    for fn in ("01:00.0", "01:00.1", "01:00.2", "01:00.3"):
        _walk(data["pci"], fn)["driver"] = "vfio-pci"


@pytest.fixture(scope="module")
def roots(hosts: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("kube-hosts")
    return {
        **hosts,
        "hgx-39": _variant(base, "hgx-h100", "hgx-39", lambda d: d["cpu"].update(phys_bits=39)),
        "turing-vfio": _variant(base, "turing-desktop", "turing-vfio", _vfio_bound),
    }


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def streams(roots: dict[str, Path]) -> dict[str, str]:
    out: dict[str, str] = {}
    import contextlib
    import io

    for case, (host, flags) in CASES.items():
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
            assert main(["kubevirt", "render", "--root", str(roots[host]), *flags]) == 0, case
        out[case] = buf.getvalue()
    return out


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


@pytest.mark.parametrize("case", sorted(CASES))
def test_manifests_match_golden(case: str, streams: dict[str, str], regenerate: bool) -> None:
    assert_golden(KUBE_GOLDEN / f"{case}.yaml", streams[case], regenerate, "kubevirt render")


@pytest.mark.realworld  # KubeVirt's and Kubernetes' API schemas in ../shared/realworld
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_object_validates_against_the_real_schemas(
    case: str, streams: dict[str, str]
) -> None:
    docs = _docs(streams[case])
    assert docs
    for doc in docs:
        assert manifest_errors(doc) == [], (case, doc["kind"], doc["metadata"]["name"])


@pytest.mark.realworld  # KubeVirt's and Kubernetes' API schemas in ../shared/realworld
def test_the_schema_checks_can_fail(streams: dict[str, str]) -> None:
    """The strict checks are not vacuous: a stray field, a wrong type, a bad opaque value."""
    docs = _docs(streams["turing-4fn-dra"])
    vm = next(d for d in docs if d["kind"] == "VirtualMachine")
    bad = copy.deepcopy(vm)
    bad["spec"]["template"]["spec"]["domain"]["devices"]["gpus"][0]["rom"] = "/x.rom"
    assert manifest_errors(bad)
    bad = copy.deepcopy(vm)
    bad["spec"]["template"]["spec"]["domain"]["features"]["kvm"]["hidden"] = "yes"
    assert manifest_errors(bad)
    claim = next(d for d in docs if d["kind"] == "ResourceClaimTemplate")
    bad = copy.deepcopy(claim)
    bad["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["iommu"][
        "backendPolicy"
    ] = ""
    assert manifest_errors(bad)
    bad = copy.deepcopy(claim)
    bad["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClass"] = "vfio.gpu.nvidia.com"
    assert any("1.36.0" in e for e in manifest_errors(bad))


def _hostdev_names(xml: str, root: Path) -> tuple[Counter[str], Counter[str]]:
    """The domain's hostdevs as resource names: (GPU functions, companion functions)."""
    host = discover(str(root))
    by_addr = {f.address: f for f in host.functions}
    tree = etree.fromstring(xml.encode())
    gpus: Counter[str] = Counter()
    companions: Counter[str] = Counter()
    for a in tree.iterfind(".//hostdev/source/address"):
        fn = by_addr[
            PciAddress(*(int(a.get(k), 16) for k in ("domain", "bus", "slot", "function")))
        ]
        (gpus if fn.is_display else companions)[resource_name(fn)] += 1
    return gpus, companions


@pytest.mark.parametrize("case", sorted(RENDER_OPTS))
def test_agrees_with_renders_domain_on_cards_and_hiding(
    case: str, streams: dict[str, str], roots: dict[str, Path]
) -> None:
    host_name = CASES[case][0]
    xml = render(build_spec(discover(str(roots[host_name])), RENDER_OPTS[case]))
    docs = _docs(streams[case])
    vm = next(d for d in docs if d["kind"] == "VirtualMachine")
    domain = vm["spec"]["template"]["spec"]["domain"]
    devices = domain["devices"]
    from_vm: Counter[str] = Counter(
        d["deviceName"]
        for d in devices["gpus"] + devices.get("hostDevices", [])
        if "deviceName" in d
    )
    claims = [d for d in devices["gpus"] if "claimName" in d]
    gpus, companions = _hostdev_names(xml, roots[host_name])
    if claims:  # the DRA route: the GPUs come from the claim, the companions by name
        assert len(claims) == sum(gpus.values())
        want = companions
    else:
        want = gpus + companions
    assert from_vm == want
    tree = etree.fromstring(xml.encode())
    assert (tree.find(".//features/kvm/hidden") is not None) == domain["features"]["kvm"]["hidden"]
    vendor = tree.find(".//features/hyperv/vendor_id")
    assert (
        vendor is not None
        and vendor.get("value") == domain["features"]["hyperv"]["vendorid"]["vendorid"]
    )
    permitted = [d for d in docs if d["kind"] == "KubeVirt"]
    if permitted:
        names = {
            e["resourceName"]
            for e in permitted[0]["spec"]["configuration"]
            .get("permittedHostDevices", {})
            .get("pciHostDevices", [])
        }
        assert set(from_vm) <= names


def test_resource_names_as_nvidias_plugin_spells_them() -> None:
    assert plugin_name("GH100 [H100 SXM5 80GB]", 0x2330) == "GH100_H100_SXM5_80GB"
    assert plugin_name("TU104 [GeForce RTX 2080 Rev. A]", 0x1E87) == "TU104_GEFORCE_RTX_2080_REV__A"
    assert (
        plugin_name("TU104 USB Type-C UCSI Controller", 0x1AD9) == "TU104_USB_TYPEC_UCSI_CONTROLLER"
    )
    assert plugin_name(None, 0x2330) == "2330"


def test_companion_functions_are_permitted_and_requested(streams: dict[str, str]) -> None:
    docs = _docs(streams["turing-4fn"])
    permitted = docs[0]["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]
    assert [e["pciVendorSelector"] for e in permitted] == [
        "10DE:1E87",
        "10DE:10F8",
        "10DE:1AD8",
        "10DE:1AD9",
    ]
    assert all(e["externalResourceProvider"] is True for e in permitted)
    vm = docs[1]["spec"]["template"]["spec"]["domain"]["devices"]
    assert [h["name"] for h in vm["hostDevices"]] == ["gpu1-fn1", "gpu1-fn2", "gpu1-fn3"]
    win = _docs(streams["turing-4fn-windows-kubevirt-plugin"])
    assert all(
        e["externalResourceProvider"] is False
        for e in win[0]["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]
    )


def test_dra_route_one_request_per_card_and_the_gates(streams: dict[str, str]) -> None:
    text = streams["hgx-8xh100-one-vm-dra"]
    docs = _docs(text)
    assert [d["kind"] for d in docs] == ["KubeVirt", "ResourceClaimTemplate", "VirtualMachine"]
    # the CR patch holds the gate alone: nothing goes by name (no companions on an H100)
    assert docs[0]["spec"] == {
        "configuration": {"developerConfiguration": {"featureGates": ["GPUsWithDRA"]}}
    }
    docs = docs[1:]
    requests = docs[0]["spec"]["spec"]["devices"]["requests"]
    assert [r["name"] for r in requests] == [f"gpu{i}" for i in range(1, 9)]
    assert {r["exactly"]["deviceClassName"] for r in requests} == {"vfio.gpu.nvidia.com"}
    params = docs[0]["spec"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert params["kind"] == "VfioDeviceConfig" and params["iommu"] == {
        "backendPolicy": "LegacyOnly",
        "enableAPIDevice": True,
    }
    vmi = docs[1]["spec"]["template"]["spec"]
    assert vmi["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "hgx-all-gpus"}]
    assert [(g["claimName"], g["requestName"]) for g in vmi["domain"]["devices"]["gpus"]] == [
        ("gpus", f"gpu{i}") for i in range(1, 9)
    ]
    assert "GPUsWithDRA" in text and "PassthroughSupport, DeviceMetadata" in text
    per_card = _docs(streams["hgx-8xh100-per-card-dra"])
    assert [d["kind"] for d in per_card] == ["KubeVirt"] + [
        "ResourceClaimTemplate",
        "VirtualMachine",
    ] * 8


def test_numa_and_hugepages_where_kubevirt_can_say_them(streams: dict[str, str]) -> None:
    one = _docs(streams["hgx-8xh100-per-card"])[1]["spec"]["template"]["spec"]["domain"]
    assert one["cpu"]["dedicatedCpuPlacement"] is True and one["cpu"]["numa"] == {
        "guestMappingPassthrough": {}
    }
    assert one["memory"] == {"guest": "65536Mi", "hugepages": {"pageSize": "2Mi"}}
    # eight GPUs on two NUMA nodes: render pins nothing, and neither does the VM
    all8 = _docs(streams["hgx-8xh100-one-vm"])[1]["spec"]["template"]["spec"]["domain"]
    assert "dedicatedCpuPlacement" not in all8["cpu"]


def _refusal(argv: list[str], capsys: pytest.CaptureFixture[str], out: Path) -> str:
    code, _stdout, err = _cli([*argv, "-o", str(out)], capsys)
    lines = [e for e in err.splitlines() if e.startswith("passthrough: error:")]
    assert code == 2 and len(lines) == 1 and not out.exists(), err
    return lines[0]


def test_optimus_laptop_is_refused_with_its_code(
    roots: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path, regenerate: bool
) -> None:
    before = tree_hash(roots["optimus-laptop"])
    line = _refusal(
        ["kubevirt", "render", "--root", str(roots["optimus-laptop"]), "--name", "o"],
        capsys,
        tmp_path / "o.yaml",
    )
    assert line.endswith("[laptop-3d]")
    assert_golden(KUBE_GOLDEN / "optimus-laptop.refused.txt", line + "\n", regenerate, "refusal")
    assert tree_hash(roots["optimus-laptop"]) == before


def test_large_bar_guest_render_takes_is_refused_for_kubevirt_with_the_arithmetic(
    roots: dict[str, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path, regenerate: bool
) -> None:
    """One H100 on a 39-bit host: render fits it with X-PciMmio64Mb; KubeVirt cannot say that."""
    root = str(roots["hgx-39"])
    flags = ["--root", root, "--name", "h100-39", "--gpu", "18:00.0", "--memory", "8G"]
    code, xml, _err = _cli(["render", *flags], capsys)
    assert code == 0 and "X-PciMmio64Mb" in xml
    line = _refusal(["kubevirt", "render", *flags], capsys, tmp_path / "k.yaml")
    assert line.endswith("[large-bar]")
    assert "128.047 GiB + 1 GiB" in line and "2^39/8 = 64 GiB" in line
    assert_golden(
        KUBE_GOLDEN / "h100-39-bit-large-bar.refused.txt", line + "\n", regenerate, "refusal"
    )


@pytest.mark.parametrize(
    ("sample", "gpu", "code"),
    [
        ("bmc-only-server", "03:00.0", "bmc-vga"),
        ("amd-b550-chipset", "2b:00.0", "route-nic-in-group"),
    ],
)
def test_policy_refusals_carry_renders_codes(
    sample: str,
    gpu: str,
    code: str,
    roots: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    flags = ["--root", str(roots[sample]), "--name", "x", "--gpu", gpu]
    render_line = _refusal(["render", *flags], capsys, tmp_path / "r.xml")
    kube_line = _refusal(["kubevirt", "render", *flags], capsys, tmp_path / "k.yaml")
    assert f"[{code}]" in render_line and f"[{code}]" in kube_line


# -- validate ------------------------------------------------------------------------------


def _validate(
    tmp_path: Path,
    docs: list[dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    root: Path | None = None,
) -> tuple[int, dict[str, Any]]:
    import json

    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    argv = ["kubevirt", "validate", str(path), "--json"] + (["--root", str(root)] if root else [])
    code, out, _ = _cli(argv, capsys)
    return code, json.loads(out)


def _codes(report: dict[str, Any]) -> set[str]:
    return {f["code"] for f in report["findings"]}


def test_validate_passes_what_render_wrote(
    streams: dict[str, str],
    roots: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for case in ("turing-4fn", "turing-4fn-dra", "hgx-8xh100-one-vm"):
        code, report = _validate(tmp_path, _docs(streams[case]), capsys, roots[CASES[case][0]])
        assert (code, report["ok"], report["findings"]) == (0, True, []), case


def test_validate_finds_a_companion_left_behind(
    streams: dict[str, str],
    roots: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    docs = _docs(streams["turing-4fn"])
    docs[1]["spec"]["template"]["spec"]["domain"]["devices"]["hostDevices"].pop(0)  # the HDMI audio
    code, report = _validate(tmp_path, docs, capsys, roots["turing-desktop"])
    assert code == 1 and _codes(report) == {"kube-companion-missing"}
    assert "0000:01:00.1" in report["findings"][0]["message"]
    # and one the CR does not permit
    docs = _docs(streams["turing-4fn"])
    docs[0]["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"].pop(2)
    code, report = _validate(tmp_path, docs, capsys, roots["turing-desktop"])
    assert code == 1 and _codes(report) == {"kube-unpermitted", "kube-companion-unpermitted"}


@pytest.mark.parametrize(
    ("where", "value", "says"),
    [
        ("gpus", "x", "devices.gpus: a list, not str"),
        ("gpus", [1, 2], "devices.gpus[0]: an object, not int"),
        ("gpus", [{"deviceName": "nvidia.com/TU102"}], "devices.gpus[0]: name is required"),
        ("deviceName", 5, "devices.gpus[0].deviceName: a string"),
        ("spec", [], "spec is required, an object"),
        ("template", None, "spec.template is required, an object"),
        ("pciHostDevices", [{"pciVendorSelector": "10DE:1E07"}], "resourceName is required"),
        ("pciHostDevices", "x", "pciHostDevices: a list, not str"),
    ],
)
def test_validate_refuses_what_the_kubevirt_api_would(
    streams: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    where: str,
    value: Any,
    says: str,
) -> None:
    """A field these checks read, of a type the KubeVirt API (its swagger) does not give
    it: "ok" and exit 0 before (nothing to read was no finding); now kube-shape, exit 1."""
    docs = _docs(streams["turing-4fn"])
    vm = docs[1]
    devices = vm["spec"]["template"]["spec"]["domain"]["devices"]
    if where == "gpus":
        devices["gpus"] = value
    elif where == "deviceName":
        devices["gpus"][0]["deviceName"] = value
    elif where == "spec":
        vm["spec"] = value
    elif where == "template":
        del vm["spec"]["template"]
    else:
        docs[0]["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"] = value
    code, report = _validate(tmp_path, docs, capsys)
    assert code == 1 and "kube-shape" in _codes(report)
    assert any(says in f["message"] for f in report["findings"]), report["findings"]


def test_validate_of_no_object_is_no_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = _validate(tmp_path, [], capsys)
    assert code == 1 and _codes(report) == {"kube-empty"}


def test_validate_finds_names_that_disagree(
    streams: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = _docs(streams["turing-4fn"])
    docs[1]["spec"]["template"]["spec"]["domain"]["devices"]["gpus"][0]["deviceName"] = (
        "nvidia.com/TU104_GEFORCE_RTX_2080"
    )
    docs[0]["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"].append(
        {"pciVendorSelector": "10de:1e87", "resourceName": "nvidia.com/RTX2080"}
    )
    code, report = _validate(tmp_path, docs, capsys)
    assert code == 1 and _codes(report) == {"kube-unpermitted", "kube-name-conflict"}


def test_validate_matches_claim_requests_to_gpus(
    streams: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = _docs(streams["hgx-8xh100-one-vm-dra"])
    gpus = docs[2]["spec"]["template"]["spec"]["domain"]["devices"]["gpus"]
    gpus[7]["requestName"] = "gpu9"
    code, report = _validate(tmp_path, docs, capsys)
    assert code == 1 and _codes(report) == {"kube-request-unknown", "kube-request-unused"}
    gpus[7]["requestName"] = "gpu1"
    code, report = _validate(tmp_path, docs, capsys)
    assert _codes(report) == {"kube-request-shared", "kube-request-unused"}
    gpus[7]["claimName"] = "other"
    assert "kube-claim-unknown" in _codes(_validate(tmp_path, docs, capsys)[1])


def test_validate_bad_input_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [unclosed\n")
    code, _out, err = _cli(["kubevirt", "validate", str(bad)], capsys)
    assert code == 2 and err.count("\n") == 1 and "line" in err and "not YAML" in err
    bad.write_text("- just\n- a list\n")
    code, _out, err = _cli(["kubevirt", "validate", str(bad)], capsys)
    assert code == 2 and "no kind" in err
    code, _out, err = _cli(["kubevirt", "validate", str(tmp_path / "missing.yaml")], capsys)
    assert code == 2 and err.count("\n") == 1


# -- preflight -----------------------------------------------------------------------------


def _preflight(
    root: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, dict[str, Any]]:
    import json

    code, out, _ = _cli(["kubevirt", "preflight", "--root", str(root), "--json", *extra], capsys)
    return code, json.loads(out)


def test_preflight_fails_a_card_on_host_drivers_and_sets_no_label(
    roots: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = _preflight(roots["turing-desktop"], capsys)
    assert code == 1 and report["ok"] is False and report["labels"] == {}
    failed = {c["id"] for c in report["checks"] if c["level"] == "FAIL"}
    assert failed == {"kube-vfio-bound", "kube-mode-label"}
    bound = next(c for c in report["checks"] if c["id"] == "kube-vfio-bound")
    assert (
        "0000:01:00.1 on snd_hda_intel" in bound["summary"]
        and "0000:01:00.2 on xhci_hcd" in bound["summary"]
    )


@pytest.mark.parametrize(
    ("memory", "says"), [("0", "below the minimum of 256 MiB"), ("100M", "below")]
)
def test_preflight_holds_memory_to_renders_range(
    roots: dict[str, Path], capsys: pytest.CaptureFixture[str], memory: str, says: str
) -> None:
    """--memory 0 was taken (a guest of nothing fits every card): the range render holds."""
    argv = ["kubevirt", "preflight", "--root", str(roots["turing-desktop"]), "--memory", memory]
    code, out, err = _cli(argv, capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and says in err, err


def test_per_card_names_leave_room_for_the_cards_there_are(
    roots: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Eight cards need '-8': a 61-character name fits 63 (it was refused, room kept for
    '-99'); one more character is refused naming the room left."""
    root = str(roots["hgx-h100"])
    argv = ["kubevirt", "render", "--root", root, "--per-card", "--name"]
    code, out, err = _cli([*argv, "a" * 61], capsys)
    assert code == 0, err
    assert f"name: {'a' * 61}-8\n" in out
    code, out, err = _cli([*argv, "a" * 62], capsys)
    assert code == 2 and "61 for the name" in err, err


def test_a_warning_the_same_for_every_card_is_said_once(
    roots: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """The NVSwitch warning of an eight-card VM came eight times: once, with the count, as
    render says it."""
    code, _out, err = _cli(
        ["kubevirt", "render", "--root", str(roots["hgx-h100"]), "--name", "h"], capsys
    )
    assert code == 0, err
    (line,) = [w for w in err.splitlines() if "NVSwitch" in w]
    assert "(the same for 8 cards) [nvswitch]" in line


def test_preflight_passes_a_vfio_bound_card_and_names_the_label(
    roots: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = _preflight(roots["turing-vfio"], capsys)
    assert code == 0 and report["ok"] is True
    assert report["labels"] == {"nvidia.com/gpu.workload.config": "vm-passthrough"}
    assert {c["level"] for c in report["checks"]} == {"PASS"}


def test_preflight_large_bar_and_group_codes(
    roots: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = _preflight(roots["hgx-39"], capsys, "--gpu", "18:00.0")
    assert code == 1 and any(
        c["id"] == "large-bar" and c["level"] == "FAIL" for c in report["checks"]
    )
    code, report = _preflight(roots["amd-b550-chipset"], capsys, "--gpu", "2b:00.0")
    assert code == 1 and "route-nic-in-group" in {
        c["id"] for c in report["checks"] if c["level"] == "FAIL"
    }
    code, report = _preflight(roots["optimus-laptop"], capsys)
    assert "laptop-3d" in {c["id"] for c in report["checks"] if c["level"] == "FAIL"}


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        # no flag for them (kubevirt render --help shows only what it takes): a spec naming
        # one is refused with the field
        (["--spec", "rom: 'off'"], "rom"),
        (["--spec", "bridge: br0"], "bridge"),
        (["--spec", "virt_type: qemu"], "virt_type"),
        (["--name", "GPU_vm"], "name"),
        (["--vcpus", "0"], "--vcpus"),
    ],
)
def test_what_kubevirt_cannot_say_is_refused_with_the_field(
    flags: list[str],
    field: str,
    roots: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    if flags[0] == "--spec":
        (tmp_path / "spec.yaml").write_text(flags[1] + "\n")
        flags = ["--spec", str(tmp_path / "spec.yaml")]
    argv = ["kubevirt", "render", "--root", str(roots["turing-desktop"]), "--name", "ok", *flags]
    line = _refusal(argv, capsys, tmp_path / "never.yaml")
    assert line.startswith(f"passthrough: error: {field}")


@pytest.mark.realworld  # KubeVirt's and Kubernetes' API schemas in ../shared/realworld
@pytest.mark.parametrize("sample", fakehost.sample_names())
@pytest.mark.parametrize("route", ["device-plugin", "dra"])
def test_every_sample_host_validates_or_is_refused_like_render_and_plan(
    sample: str, route: str, roots: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Every sample with a viable card: valid objects naming every function render hands over.
    Every other: exit 2 with one line, and plan or render refuse it too."""
    import json

    root = str(roots[sample])
    code, out, err = _cli(
        ["kubevirt", "render", "--root", root, "--name", "vm", "--route", route, "--json"], capsys
    )
    if code != 0:
        assert code == 2 and err.count("passthrough: error:") == 1, err
        plan_code, _o, _e = _cli(["plan", "--root", root], capsys)
        render_code, _o, _e = _cli(["render", "--root", root, "--name", "vm"], capsys)
        assert plan_code == 2 or render_code == 2 or "[laptop-3d]" in err, (sample, err)
        return
    docs = json.loads(out)["documents"]
    for doc in docs:
        assert manifest_errors(doc) == [], (sample, doc["kind"])
    xml = render(build_spec(discover(root), VmOptions(name="vm")))
    gpus, companions = _hostdev_names(xml, roots[sample])
    vm = next(d for d in docs if d["kind"] == "VirtualMachine")["spec"]["template"]["spec"]
    devices = vm["domain"]["devices"]
    assert len(devices["gpus"]) == sum(gpus.values()) >= 1
    assert Counter(h["deviceName"] for h in devices.get("hostDevices", [])) == companions
