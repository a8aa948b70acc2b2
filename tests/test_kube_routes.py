# SPDX-License-Identifier: Apache-2.0
"""Each cluster route checked by its own rules, and `kubevirt render --help` showing only the
flags the command takes.

The hgx-h100 sample is a node as NVIDIA's DRA driver wants it: IOMMU on, every H100 on the
nvidia driver (the DRA driver moves a claimed card to vfio-pci itself). Before, preflight had
no --route and failed that node on the device-plugin route's rules (kube-vfio-bound x8,
kube-mode-label)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from passthrough import fakehost
from passthrough.cli import main
from passthrough.kube import KUBE_LEAVES_OUT
from passthrough.kube.build import _LIBVIRT_ONLY


@pytest.fixture(scope="module")
def hgx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fakehost.build(fakehost.load("hgx-h100"), tmp_path_factory.mktemp("n") / "hgx")


def _preflight(root: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict]:
    code = main(["kubevirt", "preflight", "--root", str(root), "--memory", "64G", "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


def test_the_dra_route_passes_a_node_prepared_for_nvidias_dra_driver(
    hgx: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = _preflight(hgx, capsys, "--route", "dra")
    assert code == 0 and report["ok"] is True and report["route"] == "dra"
    ids = [c["id"] for c in report["checks"]]
    assert "kube-vfio-bound" not in ids and "kube-mode-label" not in ids
    assert ids.count("kube-dra-driver") == 8
    assert report["labels"] == {}  # the GPU Operator's mode label is the other route's
    gate = next(c for c in report["checks"] if c["id"] == "kube-dra-passthrough-gate")
    assert "PassthroughSupport" in gate["summary"]
    assert [c["level"] for c in report["checks"] if c["id"] == "kube-dra-route"] == ["PASS"]


@pytest.mark.parametrize("route", [[], ["--route", "plugin"], ["--route", "device-plugin"]])
def test_the_device_plugin_route_still_wants_the_cards_on_vfio(
    hgx: Path, capsys: pytest.CaptureFixture[str], route: list[str]
) -> None:
    code, report = _preflight(hgx, capsys, *route)
    assert code == 1 and report["route"] == "device-plugin"
    bound = [c for c in report["checks"] if c["id"] == "kube-vfio-bound"]
    assert len(bound) == 8 and {c["level"] for c in bound} == {"FAIL"}


def test_kubevirt_render_help_shows_only_the_flags_it_takes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["kubevirt", "render", "--help"])
    text = capsys.readouterr().out
    shown = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))
    for name in KUBE_LEAVES_OUT:
        assert "--" + name.replace("_", "-") not in shown, name
    assert "--gpu" in shown and "--route" in shown
    assert {name for name, _d, _w in _LIBVIRT_ONLY} | {"no_gpu"} == KUBE_LEAVES_OUT


def test_a_left_out_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["kubevirt", "render", "--name", "x", "--rom", "off"])
    assert exit_.value.code == 2
    assert "unrecognized arguments: --rom off" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("cdrom", "/srv/iso/win11.iso"),
        ("driver_iso", "/srv/iso/virtio-win.iso"),
        ("disk_bus", "sata"),
        ("graphics", "spice"),
        ("headless", True),
        ("usb_input", False),
        ("topology", False),
    ],
)
def test_an_install_option_kubevirt_cannot_express_is_refused_not_dropped(
    hgx: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, value: object
) -> None:
    """The installable guest's options (issue 47) have no KubeVirt field here: a spec naming
    one is refused with the field named, nothing written (they were taken and ignored), and
    `kubevirt render --help` does not offer their flags."""
    spec = tmp_path / "vm.yaml"
    spec.write_text(json.dumps({"name": "win11", "profile": "windows", key: value}))
    out = tmp_path / "vm.out.yaml"
    code = main(["kubevirt", "render", "--root", str(hgx), "--spec", str(spec), "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and f"error: {key}: KubeVirt has no field for" in err, err
    assert not out.exists()
    from passthrough.vm.options import BY_NAME

    with pytest.raises(SystemExit):
        main(["kubevirt", "render", "--help"])
    flag = BY_NAME[key].flag or "--" + key.replace("_", "-")
    assert flag not in capsys.readouterr().out
