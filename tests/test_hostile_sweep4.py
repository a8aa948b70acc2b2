# SPDX-License-Identifier: Apache-2.0
"""Issue 46, the fourth hostile sweep (the inputs' half): a FIFO where a file belongs never
hangs a reader, a live-driver journal of the wrong types is one line, a stream of tiny
documents is refused after the 1,000th, integers of thousands of digits and duplicate keys
in every YAML input are one line naming file and line, the host command's malformed payload
is one line with exit 2, and a runtime venv a ``#!`` line cannot hold is refused.

Each runs the real CLI (or the real module, or ``python -I -m passthrough.hosttask``) in a
subprocess with a timeout; nothing here is mocked."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from passthrough.live.livedrivers import LIVE

from .conftest import build_variant
from .test_hostile_contain import one_error_line

PT = [sys.executable, "-m", "passthrough"]
GPU = "0000:24:00.0"  # acs-override-proxmox: the RTX 3060 and its audio on vfio-pci
HUGE = "9" * 5000  # past Python's 4,300-digit limit on int()
SECONDS = 30  # a hang fails as a timeout; a refusal takes a second or two


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PT, *args], capture_output=True, text=True, check=False, timeout=SECONDS, cwd=cwd
    )


def refused(r: subprocess.CompletedProcess[str], *words: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    line = one_error_line(r)
    for word in words:
        assert word in line, (word, line)
    return line


@pytest.fixture
def on_vfio(tmp_path: Path) -> Path:
    return build_variant(tmp_path, "acs-override-proxmox", iommufd={"vfio_dev": True})


# -- 1. a FIFO where a file belongs: refused without waiting for a writer ----------------


def test_release_refuses_a_fifo_at_its_live_journal_without_blocking(on_vfio: Path) -> None:
    journal = on_vfio / LIVE
    journal.parent.mkdir(parents=True)
    os.mkfifo(journal)
    r = cli("release", "--root", str(on_vfio), "--gpu", GPU, "--yes")  # blocked for ever
    refused(r, str(journal), "not a regular file", "nothing was changed")
    assert journal.is_fifo()


def test_validate_refuses_a_fifo_config_without_blocking(tmp_path: Path) -> None:
    (tmp_path / "d.xml").write_text("<domain/>\n")
    os.mkfifo(tmp_path / "cfg.yaml")
    r = cli("validate", "--config", str(tmp_path / "cfg.yaml"), str(tmp_path / "d.xml"))
    refused(r, "cfg.yaml", "not a regular file")


def test_provision_reads_past_a_fifo_inventory_without_blocking(tmp_path: Path) -> None:
    """The check for the sample inventory reads the inventory first: a FIFO there is left
    to Ansible to name, not waited on."""
    fifo = tmp_path / "hosts.yaml"
    os.mkfifo(fifo)
    code = f"from passthrough.cli.provision import _needs_sample; _needs_sample({str(fifo)!r})"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr


def test_the_host_command_reads_a_fifo_identity_as_none(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "passthrough-runtime")
    payload = {
        "params": {"root": str(tmp_path), "state": "present"},
        "check_mode": True,
        "runtime": {"identity": "1.0+abc", "venv": str(tmp_path)},
    }
    r = _hosttask(base64.b64encode(json.dumps(payload).encode()).decode())
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.split("passthrough-task-result:", 1)[1])
    assert result["passthrough_runtime"] == {"have": "", "lacking": []}


# -- 2. the live-driver journal: each field of the type it must have ---------------------


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"host_driver": 5, "where": "vfio"}, "'host_driver'"),
        ({"host_driver": ["nvidia"], "where": "vfio"}, "'host_driver'"),
        ({"host_driver": "../../bind", "where": "vfio"}, "'host_driver'"),
        ({"host_driver": "nvidia", "where": 1}, "'where'"),
        ({"host_driver": "nvidia", "where": "vfio", "moving": {}}, "'moving'"),
        ({"host_driver": "nvidia", "where": "vfio", "at": "noon"}, "'at'"),
    ],
)
def test_a_live_journal_field_of_the_wrong_type_is_one_line(
    on_vfio: Path, entry: dict[str, object], field: str
) -> None:
    journal = on_vfio / LIVE
    journal.parent.mkdir(parents=True)
    journal.write_text(json.dumps({"format": 1, "functions": {GPU: entry}}))
    r = cli("release", "--root", str(on_vfio), "--gpu", GPU, "--yes")
    refused(r, str(journal), f"{GPU}: {field}", "nothing was changed")


# -- 3. kubevirt validate: documents capped while they are parsed -------------------------


def test_a_stream_of_tiny_documents_is_refused_after_the_thousandth(tmp_path: Path) -> None:
    """8 MiB of ``--- {}``: a million documents, of which only 1,001 are parsed."""
    from passthrough.kube.io import MAX_BYTES, BadManifest, load_stream

    path = tmp_path / "many.yaml"
    path.write_text("--- {}\n" * ((MAX_BYTES - 1) // 7))
    start = time.process_time()
    with pytest.raises(BadManifest, match="more than 1000 documents"):
        load_stream(str(path))
    took = time.process_time() - start
    assert took < 2.0, f"{took:.1f} s of CPU: the whole stream was parsed"
    r = cli("kubevirt", "validate", str(path))
    refused(r, "many.yaml", "more than 1000 documents")


# -- 5. integers past Python's digit limit: one line naming the file and line -------------


def _manifest(value: str) -> str:
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\ndata:\n  x: {value}\n"


@pytest.mark.parametrize(
    ("name", "text", "args"),
    [
        ("spec.yaml", f"memory: {HUGE}\n", ["render", "--gpu", "01:00.0", "--spec", "{file}"]),
        (
            "spec.yaml",
            f"memory: 0x{'f' * 5000}\n",
            ["render", "--gpu", "01:00.0", "--spec", "{file}"],
        ),
        (
            "spec.yaml",
            f"vcpus: 2\nmemory: {HUGE}\n",
            ["kubevirt", "render", "--name", "x", "--gpu", "01:00.0", "--spec", "{file}"],
        ),
        ("vm.yaml", _manifest(HUGE), ["kubevirt", "validate", "{file}"]),
        ("host.yaml", f"name: big\nmemory: {HUGE}\n", ["sample", "build", "{file}", "{out}"]),
        ("cfg.yaml", f"strict: {HUGE}\n", ["validate", "{xml}", "--config", "{file}"]),
    ],
)
def test_an_integer_of_thousands_of_digits_is_one_line(
    tmp_path: Path, name: str, text: str, args: list[str]
) -> None:
    path = tmp_path / name
    path.write_text(text)
    (tmp_path / "d.xml").write_text("<domain/>\n")
    places = {"file": path, "out": tmp_path / "out", "xml": tmp_path / "d.xml"}
    line = refused(
        cli(*(a.format(**places) for a in args)), name, "line ", "characters long (at most 100)"
    )
    assert len(line) < 300
    assert not (tmp_path / "out").exists()


def test_a_size_of_thousands_of_digits_is_one_short_line(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text(f'memory: "{HUGE}G"\n')
    line = refused(cli("render", "--gpu", "01:00.0", "--spec", str(tmp_path / "spec.yaml")))
    assert "spec.yaml: memory:" in line and "is not MiB or a size" in line and len(line) < 300
    line = refused(cli("render", "--gpu", "01:00.0", "--memory", f"{HUGE}G"))
    assert "--memory" in line and len(line) < 300


def test_a_toml_config_integer_of_thousands_of_digits_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(f"[tool.passthrough.validate]\nstrict = {HUGE}\n")
    (tmp_path / "d.xml").write_text("<domain/>\n")
    refused(cli("validate", "d.xml", cwd=tmp_path), "pyproject.toml", "not valid TOML")


# -- 6. the host command's payload ---------------------------------------------------------


def _hosttask(payload: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-I", "-m", "passthrough.hosttask", payload],
        capture_output=True,
        text=True,
        timeout=SECONDS,
    )


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize(
    "payload",
    [
        "not base64 at all!",
        _b64(b"{cut short"),
        _b64(b"[1, 2]"),
        _b64(b'{"params": 5, "check_mode": true}'),
        _b64(b'{"params": {}, "check_mode": true}'),
        _b64(b'{"params": {"root": "/", "state": "present"}, "check_mode": "no"}'),
        _b64(b'{"a": ' + HUGE.encode() + b"}"),
        _b64(b"[" * 20_000),
        _b64(b"\xff\xfe"),
    ],
)
def test_a_malformed_host_command_payload_is_one_line_and_exit_2(payload: str) -> None:
    r = _hosttask(payload)
    assert r.returncode == 2, (r.returncode, r.stderr[-1000:])
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("passthrough.hosttask: bad PAYLOAD: "), lines


# -- 7. duplicate keys refused, as kubectl refuses them -----------------------------------

VM_TWICE = """\
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: gpu-vm
spec:
  template:
    spec:
      domain:
        devices:
          gpus:
            - name: gpu1
              deviceName: nvidia.com/GH100_H100_SXM5_80GB
              deviceName: example.com/UNPERMITTED
"""


@pytest.mark.parametrize(
    ("name", "text", "args", "key", "line"),
    [
        ("vm.yaml", VM_TWICE, ["kubevirt", "validate", "{file}"], "'deviceName'", 13),
        (
            "cfg.yaml",
            "select: [schema]\nselect: [gpu-scope]\n",
            ["validate", "{xml}", "--config", "{file}"],
            "'select'",
            2,
        ),
        (
            "host.yaml",
            "name: a\ncpu: {vendor: intel}\nname: b\n",
            ["sample", "build", "{file}", "{out}"],
            "'name'",
            3,
        ),
        ("spec.yaml", "memory: 4G\nmemory: 8G\n", ["render", "--spec", "{file}"], "memory", 2),
    ],
)
def test_a_key_given_twice_is_refused_naming_it_and_its_line(
    tmp_path: Path, name: str, text: str, args: list[str], key: str, line: int
) -> None:
    path = tmp_path / name
    path.write_text(text)
    (tmp_path / "d.xml").write_text("<domain/>\n")
    places = {"file": path, "out": tmp_path / "out", "xml": tmp_path / "d.xml"}
    said = refused(cli(*(a.format(**places) for a in args)), name, key, f"line {line}")
    assert "twice" in said
    assert not (tmp_path / "out").exists()


def test_a_merge_key_overridden_is_no_duplicate() -> None:
    """YAML's ``<<`` brings keys that the mapping's own override: that is what it means."""
    import yaml

    from passthrough.inputs import yaml_without_aliases

    loader = yaml_without_aliases("a host description", max_nodes=100)
    text = "base: &b {a: 1, b: 2}\nthis:\n  <<: *b\n  a: 3\n"
    assert yaml.load(text, Loader=loader)["this"] == {"a": 3, "b": 2}


# -- 8. the runtime venv: a path a #! line cannot hold is refused ---------------------------


@pytest.mark.parametrize("venv", ["/opt/pass through/venv", "/opt/venv\tx", "/opt/" + "v" * 260])
def test_the_runtime_module_refuses_a_venv_a_shebang_cannot_hold(tmp_path: Path, venv: str) -> None:
    from .test_options_ansible import _run_module

    where = str(tmp_path / venv.lstrip("/"))
    out = _run_module(
        tmp_path, "passthrough_runtime", venv=where, identity="1.0", wheel=str(tmp_path / "w.whl")
    )
    assert out.get("failed") is True, out
    assert "#! line" in out["msg"] and "nothing changed" in out["msg"]
    assert not Path(where).exists()


def test_a_live_journal_key_given_twice_is_one_line(on_vfio: Path) -> None:
    """The later of two ``host_driver`` keys would decide which driver the card goes back to."""
    journal = on_vfio / LIVE
    journal.parent.mkdir(parents=True)
    entry = '{"host_driver": "nvidia", "host_driver": "vfio-pci", "where": "vfio"}'
    text = f'{{"format": 1, "functions": {{"{GPU}": {entry}}}}}'
    journal.write_text(text)
    first = text.index('"host_driver"') + 1
    second = text.index('"host_driver"', first) + 1
    r = cli("release", "--root", str(on_vfio), "--gpu", GPU, "--yes")
    where = (
        f"line 1, column {second}: key 'host_driver' given twice (first at line 1, column {first})"
    )
    refused(r, str(journal), where, "nothing was changed")


def test_a_journal_key_given_twice_is_named_with_its_line(tmp_path: Path) -> None:
    """Issue 46: a key given twice in a JSON file we read (the journal undo follows) was
    refused without saying where; a journal is indented over hundreds of lines. The line and
    column of the second key, and of the first, are named."""
    from passthrough import fakehost

    from .conftest import tree_hash

    root = fakehost.build(fakehost.load("consumer-intel"), tmp_path / "root")
    assert cli("apply", "--root", str(root), "--yes", "--quiet").returncode == 0
    journal = root / "var/lib/passthrough/journal.json"
    lines = journal.read_text().splitlines(keepends=True)
    kind = next(i for i, line in enumerate(lines) if line.strip() == '"kind": "apply",')
    lines.insert(kind + 1, '      "kind": "undo",\n')
    journal.write_text("".join(lines))
    before = tree_hash(root)
    r = cli("undo", "--root", str(root), "--yes")
    refused(
        r,
        str(journal),
        f"line {kind + 2}, column 7: key 'kind' given twice (first at line {kind + 1}, column 7)",
    )
    assert tree_hash(root) == before


@pytest.mark.parametrize(
    ("text", "where"),
    [
        # strings holding quotes and braces are stepped over as strings
        ('{"a": {"b": [1, {"c": "x\\"}", "c": 2}]}}', "line 1, column 31: key 'c'"),
        # an inner key of the same name is another object's: the top level's second "a"
        ('{"a": {"a": 1},\n "b": 2,\n "a": 3}', "line 3, column 2: key 'a'"),
        # a key spelled with an escape is the same key
        ('{\n  "\\u00e9": 1,\n  "\u00e9": 2\n}', "line 3, column 3: key '\u00e9'"),
    ],
)
def test_the_place_of_a_json_key_given_twice(text: str, where: str) -> None:
    from passthrough.journal.journal_json import Twice, loads

    with pytest.raises(Twice) as caught:
        loads(text.encode())
    assert str(caught.value).startswith(where + " given twice (first at line "), caught.value
