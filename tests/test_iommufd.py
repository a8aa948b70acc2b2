# SPDX-License-Identifier: Apache-2.0
"""Guests on iommufd: render --iommufd (and the spec key) on a host that has every piece,
its refusals where the host, QEMU or libvirt lacks one, what validate says of the form
against Debian 12's schema and against one that knows the attribute, and the DRA claim's
backend policy."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from .cli_process import run_cli
from .conftest import GOLDEN, assert_golden, build_variant

READY_KERNEL = {
    "cmdline": "BOOT_IMAGE=/boot/vmlinuz-6.8.12-4-pve root=/dev/mapper/pve-root ro iommu=pt",
    "config": {"CONFIG_IOMMUFD": "y", "CONFIG_VFIO_DEVICE_CDEV": "y"},
}
NEW_STACK = {"qemu-system-x86": "1:10.0.2+ds-1", "libvirt-daemon": "12.1.0-1"}
NODES = {"dev_iommu": True, "vfio_dev": True}
GPU = "0000:24:00.0"  # acs-override-proxmox's card, bound to vfio-pci
SCHEMAS = Path("/usr/share/libvirt/schemas")


def _host(tmp_path: Path, **overrides: object) -> Path:
    described = {"kernel": READY_KERNEL, "packages": NEW_STACK, "iommufd": NODES, **overrides}
    return build_variant(tmp_path, "acs-override-proxmox", **described)


def _render(root: Path, out: Path, *extra: str) -> tuple[int, str]:
    args = ["render", "--root", str(root), "--name", "g1", "--gpu", GPU, "-o", str(out)]
    r = run_cli([*args, *extra])
    return r.returncode, r.stderr


@pytest.fixture(scope="module")
def ready(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _host(tmp_path_factory.mktemp("ready"))


@pytest.fixture(scope="module")
def rendered(ready: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("xml") / "g1.xml"
    rc, err = _render(ready, out, "--iommufd")
    assert rc == 0, err
    return out


def test_render_iommufd_golden(rendered: Path, regenerate: bool) -> None:
    text = rendered.read_text()
    assert_golden(GOLDEN / "vm" / "iommufd-ready.xml", text, regenerate, "render --iommufd")
    assert text.count("<driver name='vfio' iommufd='yes'/>") == 2  # the card's two functions


def test_render_without_the_flag_is_the_legacy_container(ready: Path, tmp_path: Path) -> None:
    out = tmp_path / "legacy.xml"
    assert _render(ready, out)[0] == 0
    assert "iommufd" not in out.read_text()


def test_spec_key_is_the_flag(ready: Path, rendered: Path, tmp_path: Path) -> None:
    spec = tmp_path / "g1.yaml"
    spec.write_text(f'name: g1\ngpus: ["{GPU}"]\niommufd: true\n')
    out = tmp_path / "spec.xml"
    r = run_cli(["render", "--root", str(ready), "--spec", str(spec), "-o", str(out)])
    assert r.returncode == 0, r.stderr
    assert out.read_text() == rendered.read_text()
    spec.write_text(f'name: g1\ngpus: ["{GPU}"]\niommufd: "yes"\n')
    r = run_cli(["render", "--root", str(ready), "--spec", str(spec), "-o", str(out)])
    assert r.returncode == 2 and "iommufd" in r.stderr and len(r.stderr.splitlines()) == 1


def _tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file() and not p.is_symlink():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (
            {"kernel": {**READY_KERNEL, "config": {"CONFIG_IOMMUFD": "n"}}},
            "CONFIG_IOMMUFD is not set in /boot/config-6.8.12-4-pve",
        ),
        ({"iommufd": {"vfio_dev": True}}, "/dev/iommu missing although iommufd is in the kernel"),
        (
            {"iommufd": {"dev_iommu": True}},
            "0000:24:00.0 is bound to vfio-pci but has no vfio-dev/vfioN",
        ),
        (
            {"packages": {"qemu-system-x86": "1:8.2.2+ds-0ubuntu1", "libvirt-daemon": "12.1.0"}},
            "QEMU 8.2 predates iommufd (9.0+)",
        ),
        (
            {"packages": {"qemu-system-x86": "1:9.0.0", "libvirt-daemon": "10.0.0-2ubuntu8"}},
            "libvirt 10.0 predates iommufd (12.1+)",
        ),
    ],
    ids=["option-off", "no-dev-iommu", "no-cdev", "old-qemu", "old-libvirt"],
)
def test_render_iommufd_refused_in_one_line(
    tmp_path: Path, overrides: dict[str, object], named: str
) -> None:
    root = _host(tmp_path, **overrides)
    before = _tree_hash(root)
    out = tmp_path / "g1.xml"
    rc, err = _render(root, out, "--iommufd")
    assert rc == 2
    assert err.startswith("passthrough: error: iommufd: this host cannot run it: ")
    assert named in err and len(err.splitlines()) == 1
    assert not out.exists() and _tree_hash(root) == before


def _validate(*args: str) -> tuple[int, str]:
    r = run_cli(["validate", *args])
    return r.returncode, r.stdout


def test_debian12_schema_checks_the_rest_and_names_the_attribute(rendered: Path) -> None:
    rc, out = _validate(str(rendered))
    assert rc == 0, out
    assert out.count("warning schema-iommufd") == 2
    assert " error " not in out
    # the same domain without the attribute: the real virt-xml-validate of libvirt 9.0 agrees
    plain = rendered.with_name("plain.xml")
    plain.write_text(rendered.read_text().replace(" iommufd='yes'", ""))
    r = subprocess.run(["virt-xml-validate", str(plain), "domain"], capture_output=True)
    assert r.returncode == 0, r.stdout + r.stderr
    # and with it, libvirt 9.0's schema refuses the domain (what the warning stands in for)
    r = subprocess.run(["virt-xml-validate", str(rendered), "domain"], capture_output=True)
    assert r.returncode != 0


def _schema_with_iommufd(dest: Path) -> Path:
    """Debian 12's schemas with the one attribute libvirt 12.1 added to a PCI hostdev's
    <driver> (optional, yes or no): a minimal case written here, not libvirt's file."""
    shutil.copytree(SCHEMAS, dest)
    common = dest / "domaincommon.rng"
    text = common.read_text()
    driver = re.compile(
        r'(<define name="hostdevsubsyspci">.*?<element name="driver">.*?</attribute>)(\s*<empty/>)',
        re.S,
    )
    taught = '\n          <optional><attribute name="iommufd"><ref name="virYesNo"/></attribute></optional>'
    new, n = driver.subn(lambda m: m[1] + taught + m[2], text, count=1)
    assert n == 1, "the hostdev driver definition moved in this libvirt's schema"
    common.write_text(new)
    return dest


def test_a_schema_that_knows_the_attribute_checks_it(rendered: Path, tmp_path: Path) -> None:
    schemas = _schema_with_iommufd(tmp_path / "schemas")
    rc, out = _validate("--schema-dir", str(schemas), str(rendered))
    assert rc == 0 and "schema-iommufd" not in out, out
    r = subprocess.run(
        ["xmllint", "--noout", "--relaxng", str(schemas / "domain.rng"), str(rendered)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    wrong = tmp_path / "maybe.xml"
    wrong.write_text(rendered.read_text().replace("iommufd='yes'", "iommufd='maybe'"))
    rc, out = _validate("--schema-dir", str(schemas), str(wrong))
    assert rc == 1
    assert "error schema [schema]" in out and "error hostdev-iommufd-value" in out


def test_validate_policy_and_host_layers(rendered: Path, tmp_path: Path) -> None:
    wrong = tmp_path / "maybe.xml"
    wrong.write_text(rendered.read_text().replace("iommufd='yes'", "iommufd='maybe'"))
    rc, out = _validate(str(wrong))
    assert rc == 1 and out.count("error hostdev-iommufd-value") == 2
    old = build_variant(tmp_path, "acs-override-proxmox")
    rc, out = _validate("--host-root", str(old), str(rendered))
    assert rc == 1
    (line,) = [x for x in out.splitlines() if "host-iommufd" in x]
    assert "2 hostdev(s) on iommufd, and this host cannot run them: CONFIG_IOMMUFD" in line


def _claims(root: Path, *extra: str) -> tuple[int, list[dict[str, object]], str]:
    r = run_cli(["kubevirt", "render", "--root", str(root), "--name", "g1", "--gpu", GPU, *extra])
    docs = list(yaml.safe_load_all(r.stdout)) if r.returncode == 0 else []
    return r.returncode, [d for d in docs if d and d["kind"] == "ResourceClaimTemplate"], r.stderr


def _policy(claim: dict[str, object]) -> object:
    config = claim["spec"]["spec"]["devices"]["config"][0]  # type: ignore[index]
    return config["opaque"]["parameters"]["iommu"]["backendPolicy"]  # type: ignore[index]


def test_dra_claim_prefers_iommufd_on_a_ready_node(ready: Path, tmp_path: Path) -> None:
    rc, (claim,), _ = _claims(ready, "--route", "dra")
    assert rc == 0 and _policy(claim) == "LegacyOnly"
    rc, (claim,), err = _claims(ready, "--route", "dra", "--iommufd")
    assert rc == 0 and _policy(claim) == "PreferIommuFD"
    assert "libvirt 12.2+" in err  # KubeVirt's gate and its virt-launcher, said once
    old = build_variant(tmp_path, "acs-override-proxmox")
    rc, _, err = _claims(old, "--route", "dra", "--iommufd")
    assert rc == 2 and err.startswith("passthrough: error: iommufd: this node cannot use it: ")
    rc, _, err = _claims(ready, "--iommufd")
    assert rc == 2 and "use --route dra" in err
