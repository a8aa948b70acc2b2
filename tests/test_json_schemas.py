# SPDX-License-Identifier: Apache-2.0
"""Every ``--json`` output names its JSON Schema (``schema``: passthrough.NAME/v1) and is valid
against the published file passthrough/schemas/NAME-v1.schema.json — taken from real runs of
the commands on sample hosts, a real snapshot and libvirt's test driver."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from passthrough.cli import main

REPO = Path(__file__).resolve().parents[1]
SCHEMAS = REPO / "passthrough" / "schemas"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def valid(doc: dict[str, Any]) -> str:
    """Validate ``doc`` against the schema it names; returns that name."""
    name = doc["schema"].removeprefix("passthrough.").removesuffix("/v1")
    schema = json.loads((SCHEMAS / f"{name}-v1.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
    return str(name)


def out(capsys: pytest.CaptureFixture[str], *argv: str, code: int = 0) -> dict[str, Any]:
    assert main([*argv, "--json"]) == code, capsys.readouterr().err
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def test_every_json_output_of_the_host_chain_is_valid(
    hosts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "host"
    shutil.copytree(hosts["consumer-intel"], root, symlinks=True)
    r = str(root)
    # every command that reads a host root names it, the same way
    on_root = [
        out(capsys, "scan", "--root", r),
        out(capsys, "check", "--root", r),
        out(capsys, "plan", "--root", r),
        out(capsys, "apply", "--root", r),
        out(capsys, "status", "--root", r),
        out(capsys, "verify", "--root", r, code=1),
        out(capsys, "undo", "--root", r),
        out(capsys, "render", "--root", r, "--name", "g", "--gpu", "0000:01:00.0"),
    ]
    assert [d["root"] for d in on_root] == [r] * len(on_root)
    seen = [
        *(valid(d) for d in on_root),
        valid(out(capsys, "snapshot", "--root", r, "-o", str(tmp_path / "s.tar.gz"))),
        valid(out(capsys, "sample", "list")),
        valid(out(capsys, "validate", "--list-rules")),
        valid(out(capsys, "sample", "build", "iommu-off", str(tmp_path / "built"))),
    ]
    assert seen == [
        *("scan", "check", "plan", "apply", "status", "verify", "undo", "render"),
        *("snapshot", "sample-list", "validate-rules", "sample-build"),
    ]


def test_guest_check_json_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = FIXTURES / "h100-guest-snapshot.tar.gz"  # the real H100 guest's capture
    doc = out(capsys, "guest", "check", "--root", str(snapshot), "--no-compute")
    assert valid(doc) == "guest-check" and doc["gpus"]


def test_vm_json_is_valid_on_libvirts_test_driver(
    hosts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    xml = tmp_path / "g.xml"
    root = str(hosts["consumer-intel"])
    assert main(["render", "--root", root, "--name", "g", "--gpu", "01:00.0", "-o", str(xml)]) == 0
    capsys.readouterr()
    uri = "test:///default"
    assert valid(out(capsys, "vm", "define", str(xml), "--connect", uri)) == "vm"
    key = tmp_path / "k.pub"
    key.write_text(
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJb1m0JQp4oY7oG9i8HkGZ1Xr2b0Qk0J1Zx5z0v0Q0Q0 t\n"
    )
    seed = ["vm", "seed", "--hostname", "g", "--ssh-key", str(key), "-o", str(tmp_path / "s.iso")]
    assert valid(out(capsys, *seed)) == "vm-seed"


def test_provision_json_is_valid() -> None:
    from passthrough.provision.runner import HostResult, RunResult

    result = RunResult("failed", 2, {"h1": HostResult("h1", ok=3, changed=1, failed=1)}, None, 1.5)
    assert valid({"schema": "passthrough.provision/v1", **result.to_json()}) == "provision"


def test_every_dump_names_a_published_schema() -> None:
    """Each ``dump(obj, "NAME")`` in the CLI has passthrough/schemas/NAME-v1.schema.json."""
    names = set()
    for path in (REPO / "passthrough" / "cli").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dump":
                arg = node.args[1] if len(node.args) > 1 else None
                assert isinstance(arg, ast.Constant), f"{path.name}:{node.lineno}: no schema name"
                names.add(arg.value)
    missing = sorted(n for n in names if not (SCHEMAS / f"{n}-v1.schema.json").exists())
    assert not missing and len(names) >= 18, (missing, names)


def test_kubevirt_json_outputs_are_valid(
    hosts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(hosts["hgx-h100"])
    manifests = tmp_path / "vm.yaml"
    render = ["kubevirt", "render", "--root", root, "--name", "g", "--gpu", "18:00.0"]
    assert valid(out(capsys, *render)) == "kubevirt-render"
    assert main([*render, "-o", str(manifests)]) == 0
    capsys.readouterr()
    assert valid(out(capsys, "kubevirt", "validate", str(manifests))) == "kubevirt-validate"
    doc = out(capsys, "kubevirt", "preflight", "--root", root, code=1)  # cards on nvidia: FAIL
    assert valid(doc) == "kubevirt-preflight"


def test_paths_are_written_one_way_in_every_output(
    hosts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """plan, apply, status and undo name a file inside the root the same way: /etc/…"""
    root = tmp_path / "host"
    shutil.copytree(hosts["consumer-intel"], root, symlinks=True)
    r = str(root)
    planned = {a["path"] for a in out(capsys, "plan", "--root", r)["actions"] if "path" in a}
    applied = {s["path"] for s in out(capsys, "apply", "--root", r)["steps"] if "path" in s}
    status = out(capsys, "status", "--root", r)
    listed = {f["path"] for t in status["transactions"] for f in t["files"]}
    undone = set(out(capsys, "undo", "--root", r)["restored"])
    assert planned == applied == listed == undone
    assert all(p.startswith("/etc/") for p in planned), planned
