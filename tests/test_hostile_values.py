# SPDX-License-Identifier: Apache-2.0
"""Every value checked at the edge: a bad option, spec key, seed value or host file is one
line naming the field, exit 2, and nothing written (no output file, the host tree as it was).

The CLI runs as a subprocess, as a user meets it; the sample hosts are real trees.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from passthrough.host.discover import discover
from passthrough.vm import options
from passthrough.vm.options import IFNAME_RE, NAME_RE, NETWORK_RE, VENDOR_ID_RE, BadVmSpec
from passthrough.vm.render import render
from passthrough.vm.seed import BadSeed, check_hostname, meta_data
from passthrough.vm.spec import VmOptions, build_spec
from passthrough.vm.validate import validate_text

from .cli_process import run_cli
from .conftest import build_variant, tree_hash

PT = [sys.executable, "-m", "passthrough"]
ED25519 = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl ops@fleet"
)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(args)


def refused(r: subprocess.CompletedProcess[str], field: str) -> None:
    """Exit 2, one line, naming ``field``, no traceback."""
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert field in lines[0], (field, lines[0])
    assert "Traceback" not in r.stderr


# -- plan / apply: huge pages and the GRUB file ------------------------------------------


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A private consumer-intel tree (64 GiB of RAM, 8 CPUs, GRUB) that apply may change."""
    return build_variant(tmp_path, "consumer-intel")


@pytest.mark.parametrize("command", ["plan", "apply"])
@pytest.mark.parametrize("count", ["-1", "100000", "57", "abc", "1e3", "", "٣"])
def test_hugepages_out_of_range_changes_nothing(host: Path, command: str, count: str) -> None:
    before = tree_hash(host)
    refused(run(command, "--root", str(host), f"--hugepages-1g={count}"), "hugepages")
    assert tree_hash(host) == before


@pytest.mark.parametrize("command", ["plan", "apply"])
def test_the_old_hugepages_spelling_is_refused_with_the_new(host: Path, command: str) -> None:
    """plan's --hugepages N became --hugepages-1g N (render's --hugepages is a switch for the
    guest's memory): the old spelling is refused naming the new one, never read as either."""
    before = tree_hash(host)
    for argv in (["--hugepages=8"], ["--hugepages", "8"], ["--hugepages"]):
        refused(run(command, "--root", str(host), *argv), "--hugepages is now --hugepages-1g")
    assert tree_hash(host) == before


def test_hugepages_up_to_what_the_host_can_spare(host: Path) -> None:
    """64 GiB of RAM keeps an eighth (8 GiB) for itself: 56 pages, not 57 (above)."""
    r = run("plan", "--root", str(host), "--hugepages-1g=56")
    assert r.returncode == 0, r.stderr
    assert "hugepages=56" in r.stdout


def test_hugepages_an_earlier_apply_reserved_are_kept_until_zero(host: Path) -> None:
    """As with the cards: a new plan without the flag keeps the earlier apply's pages and says
    so; --hugepages-1g 0 takes them out (ours only: the plan drops the keys we set); then
    a plan keeps nothing, and undo brings back the original file."""
    original = (host / "etc/default/grub").read_bytes()
    assert run("apply", "--root", str(host), "--hugepages-1g", "8", "--yes").returncode == 0
    dropin = host / "etc/default/grub.d/99-passthrough.cfg"
    assert "hugepages=8" in dropin.read_text()
    kept = run("plan", "--root", str(host), "--json")
    plan = json.loads(kept.stdout)
    assert kept.returncode == 0 and plan["kernel_args"] == {"set": [], "remove": []}
    assert any(
        n.startswith("hugepages=8 (1 GiB pages): kept from the earlier apply (--hugepages-1g 0")
        for n in plan["notes"]
    ), plan["notes"]
    gone = run("plan", "--root", str(host), "--hugepages-1g", "0", "--json")
    assert json.loads(gone.stdout)["kernel_args"]["remove"] == [
        "default_hugepagesz",
        "hugepages",
        "hugepagesz",
    ]
    assert run("apply", "--root", str(host), "--hugepages-1g", "0", "--yes").returncode == 0
    assert "hugepage" not in dropin.read_text() and "vfio-pci.ids=" in dropin.read_text()
    after = json.loads(run("plan", "--root", str(host), "--json").stdout)
    assert not any("hugepages" in n for n in after["notes"]), after["notes"]
    assert run("undo", "--root", str(host), "--yes").returncode == 0
    assert not dropin.exists() and (host / "etc/default/grub").read_bytes() == original


def test_zero_pages_on_a_fresh_host_is_no_change(host: Path) -> None:
    a = run("plan", "--root", str(host), "--json")
    b = run("plan", "--root", str(host), "--hugepages-1g", "0", "--json")
    assert a.returncode == b.returncode == 0 and a.stdout == b.stdout


def test_library_checks_hugepages_too(host: Path) -> None:
    """make_plan refuses what the Ansible module could pass it (no argparse in front)."""
    from passthrough.host.root import HostRoot
    from passthrough.plan.build import BadHugepages, PlanOptions, make_plan

    facts = discover(str(host))
    for count in (-1, 57, 10**6):
        with pytest.raises(BadHugepages, match=f"^hugepages: {count} "):
            make_plan(HostRoot(str(host)), facts, PlanOptions(hugepages_1g=count))


def test_unknown_ram_is_said_not_guessed(host: Path, tmp_path: Path) -> None:
    """A tree without /proc/meminfo (an image): huge pages and guest memory go through with a
    note saying they were not checked; negative counts are still refused."""
    (host / "proc/meminfo").unlink()
    r = run("plan", "--root", str(host), "--hugepages-1g=200", "--json")
    assert r.returncode == 0, r.stderr
    assert any("/proc/meminfo" in n for n in json.loads(r.stdout)["notes"])
    out = tmp_path / "vm.xml"
    r = run("render", "--root", str(host), "--name", "t", "--memory", "1024G", "-o", str(out))
    assert r.returncode == 0 and out.exists(), r.stderr
    assert "memory not checked against the host: this root has no /proc/meminfo" in r.stderr
    refused(run("plan", "--root", str(host), "--hugepages-1g=-3"), "hugepages")


@pytest.mark.parametrize(
    ("sample", "rel"),
    [
        ("consumer-intel", "etc/default/grub"),
        ("acs-override-proxmox", "etc/kernel/cmdline"),
        ("consumer-intel", "etc/initramfs-tools/modules"),
    ],
)
def test_file_not_utf8_is_refused_with_file_and_line(tmp_path: Path, sample: str, rel: str) -> None:
    """Edited files are never written back with U+FFFD where a byte was not UTF-8."""
    root = build_variant(tmp_path, sample)
    path = root / rel
    if rel == "etc/default/grub":
        path.write_bytes(path.read_bytes() + b'GRUB_CMDLINE_LINUX="console=tty\xff0"\n')
    else:
        path.write_bytes(path.read_bytes().rstrip(b"\n") + b" caf\xe9\n")
    line = path.read_bytes().count(b"\n")
    before = tree_hash(root)
    for command in ("plan", "apply"):
        r = run(command, "--root", str(root))
        refused(r, f"/{rel}:{line}")
        assert "UTF-8" in r.stderr
        assert tree_hash(root) == before


# -- render: the spec file -----------------------------------------------------------------

SPEC_CASES: dict[str, tuple[bytes, str]] = {
    "vcpus-float": (b"vcpus: 8.5\n", "vcpus"),
    "vcpus-bool": (b"vcpus: true\n", "vcpus"),
    "vcpus-zero": (b"vcpus: 0\n", "vcpus"),
    "vcpus-octal": (b"vcpus: 010\n", "vcpus"),
    "vcpus-beyond-host": (b"vcpus: 9\n", "vcpus"),
    "hide-string": (b'hide: "off"\n', "hide"),
    "rom-relative": (b"rom: roms/card.rom\n", "rom"),
    "rom-number": (b"rom: 1\n", "rom"),
    "name-number": (b"name: 123\n", "name"),
    "name-bool": (b"name: yes\n", "name"),
    "gpu-sexagesimal": (b"gpu: 01:00.0\n", "gpu"),
    "gpus-sexagesimal-in-list": (b"gpus: [01:00.0]\n", "gpus"),
    "gpu-garbage": (b"gpu: 'zz:00.0'\n", "gpu"),
    "unknown-key": (b"vcpu: 4\n", "vcpu"),
    "duplicate-key": (b"vcpus: 2\nvcpus: 4\n", "vcpus"),
    "memory-float": (b"memory: 1.5\n", "memory"),
    "memory-beyond-host": (b"memory: 65G\n", "memory"),
    "memory-beyond-libvirt": (b"memory: 99999999999G\novercommit: true\n", "memory"),
    "memory-too-little": (b"memory: 128\n", "memory"),
    "bridge-comma": (b"bridge: 'a,b'\n", "bridge"),
    "bridge-too-long": (b"bridge: abcdefghijklmnop\n", "bridge"),
    "network-space": (b"network: 'a b'\n", "network"),
    "profile": (b"profile: macos\n", "profile"),
    "disk-relative": (b"disk: vm.qcow2\n", "disk"),
    "empty-value": (b"bridge:\n", "bridge"),
    "not-utf8": (b"vendor_id: \xff\xfe\n", "line 2"),
    "not-a-mapping": (b"- vcpus\n", "--spec"),
    "larger-than-1-MiB": (b"name: t\n" + b"#" * (1 << 20) + b"\nvcpus: 2\n", "--spec"),
}


@pytest.mark.parametrize("case", sorted(SPEC_CASES))
def test_bad_spec_value_is_refused_naming_the_key(
    hosts: dict[str, Path], tmp_path: Path, case: str
) -> None:
    body, field = SPEC_CASES[case]
    spec = tmp_path / "vm.yaml"
    # the name first, unless the case is about it
    spec.write_bytes(body if body.startswith((b"name", b"-")) else b"name: t\n" + body)
    out = tmp_path / "vm.xml"
    r = run("render", "--root", str(hosts["consumer-intel"]), "--spec", str(spec), "-o", str(out))
    refused(r, field)
    assert not out.exists()


def test_yaml_number_says_quote_the_address(hosts: dict[str, Path], tmp_path: Path) -> None:
    spec = tmp_path / "vm.yaml"
    spec.write_text("name: t\ngpu: 01:00.0\n")
    r = run("render", "--root", str(hosts["consumer-intel"]), "--spec", str(spec))
    refused(r, "gpu")
    assert "quote the PCI address" in r.stderr and '"01:00.0"' in r.stderr
    spec.write_text("name: t\ngpu: '01:00.0'\nrom: off\nhide: off\n")  # as intended: renders
    r = run("render", "--root", str(hosts["consumer-intel"]), "--spec", str(spec))
    assert r.returncode == 0, r.stderr
    assert "<rom bar='off'/>" in r.stdout and "<hidden state='on'/>" not in r.stdout


def test_unknown_key_suggests_the_known_one(hosts: dict[str, Path], tmp_path: Path) -> None:
    spec = tmp_path / "vm.yaml"
    spec.write_text("name: t\nhugepage: true\n")
    r = run("render", "--root", str(hosts["consumer-intel"]), "--spec", str(spec))
    refused(r, "hugepage")
    assert "did you mean 'hugepages'?" in r.stderr


# -- render: the flags -----------------------------------------------------------------------

FLAG_CASES: dict[str, tuple[list[str], str]] = {
    "rom-relative": (["--rom", "rel/path"], "--rom"),
    "bridge-comma": (["--bridge", "a,b"], "--bridge"),
    "bridge-slash": (["--bridge", "br/0"], "--bridge"),
    "bridge-space": (["--bridge", "br 0"], "--bridge"),
    "bridge-16": (["--bridge", "b" * 16], "--bridge"),
    "bridge-dotdot": (["--bridge", ".."], "--bridge"),
    "memory-huge": (["--memory", "99999999999G", "--allow-overcommit"], "--memory"),
    "memory-beyond-host": (["--memory", "65G"], "memory"),
    "memory-text": (["--memory", "lots"], "--memory"),
    "vcpus-zero": (["--vcpus", "0"], "--vcpus"),
    "vcpus-negative": (["--vcpus", "-1"], "--vcpus"),
    "vcpus-float": (["--vcpus", "8.5"], "--vcpus"),
    "vcpus-beyond-host": (["--vcpus", "9"], "vcpus"),
    "network": (["--network", "net]]>"], "--network"),
    "image-dir-relative": (["--image-dir", "images"], "--image-dir"),
    "gpu": (["--gpu", "01:00"], "--gpu"),
    # a pattern's $ matches before a final newline: the table matches whole values
    "name-newline": (["--name", "ok\n"], "--name"),
    "bridge-newline": (["--bridge", "br0\n"], "--bridge"),
}


@pytest.mark.parametrize("case", sorted(FLAG_CASES))
def test_bad_flag_is_refused_naming_it(hosts: dict[str, Path], tmp_path: Path, case: str) -> None:
    args, field = FLAG_CASES[case]
    out = tmp_path / "vm.xml"
    r = run("render", "--root", str(hosts["consumer-intel"]), "--name", "t", *args, "-o", str(out))
    refused(r, field)
    assert not out.exists()


def test_overcommit_is_explicit(hosts: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "vm.xml"
    root = str(hosts["consumer-intel"])
    r = run("render", "--root", root, "--name", "t", "--memory", "65G", "--allow-overcommit")
    assert r.returncode == 0, r.stderr
    assert "<memory unit='MiB'>66560</memory>" in r.stdout
    r = run("render", "--root", root, "--name", "t", "--memory", "64G", "-o", str(out))
    assert r.returncode == 0 and out.exists(), r.stderr  # all of the host's RAM: allowed


def test_memory_ceiling_is_libvirts() -> None:
    """The table's memory maximum is exactly what libvirt parses (its test driver, private
    to this process): one MiB more overflows there, so the table refuses it first."""
    import libvirt

    conn = libvirt.open("test:///default")
    try:

        def define(mib: int) -> None:
            conn.defineXML(
                f"<domain type='test'><name>hostile-values-mem</name><memory unit='MiB'>{mib}"
                "</memory><vcpu>1</vcpu><os><type>hvm</type></os></domain>"
            ).undefine()

        define(options.MAX_MEMORY_MIB)
        with pytest.raises(libvirt.libvirtError, match="too large"):
            define(options.MAX_MEMORY_MIB + 1)
    finally:
        conn.close()
    with pytest.raises(BadVmSpec, match="above the maximum"):
        options.check(options.BY_NAME["memory_mib"], options.MAX_MEMORY_MIB + 1, "memory")


def test_spec_file_and_flags_agree(hosts: dict[str, Path], tmp_path: Path) -> None:
    """The same options as flags and as spec keys give the same XML."""
    root = str(hosts["consumer-intel"])
    spec = tmp_path / "vm.yaml"
    spec.write_text(
        "name: same\nvcpus: 6\nmemory: 12G\ngpus: ['0000:01:00.0']\nbridge: br0\nrom: off\n"
        "hide: false\nprofile: windows\nhugepages: true\nnuma_pin: false\nvirt-type: qemu\n"
        "image_dir: /srv/images\nhide_hypervisor_cpuid: true\n"
    )
    by_spec = run("render", "--root", root, "--spec", str(spec))
    by_flags = run(
        "render", "--root", root, "--name", "same", "--vcpus", "6", "--memory", "12G",
        "--gpu", "0000:01:00.0", "--bridge", "br0", "--rom", "off", "--no-hide",
        "--profile", "windows", "--hugepages", "--no-numa-pin", "--virt-type", "qemu",
        "--image-dir", "/srv/images", "--hide-hypervisor-cpuid",
    )  # fmt: skip
    assert by_spec.returncode == 0 and by_flags.returncode == 0, (by_spec.stderr, by_flags.stderr)
    assert by_spec.stdout == by_flags.stdout
    assert "<vcpu placement='static'>6</vcpu>" in by_spec.stdout


def test_the_table_is_vmoptions() -> None:
    """One row per VmOptions field, with the same default; one render flag per row."""
    fields = {f.name: f for f in dataclasses.fields(VmOptions)}
    assert set(fields) == set(options.BY_NAME)
    for name, f in fields.items():
        if f.default is not dataclasses.MISSING:
            assert options.BY_NAME[name].default == f.default, name
    help_text = run("render", "--help").stdout
    for opt in options.OPTIONS:
        assert opt.cli_flag in help_text, opt.cli_flag


def test_python_api_is_checked_too(hosts: dict[str, Path]) -> None:
    """build_spec re-checks a VmOptions built in code (the Ansible module does that)."""
    host = discover(str(hosts["consumer-intel"]))
    for kwargs, field in (
        ({"vcpus": True}, "vcpus"),
        ({"hide": "off"}, "hide"),
        ({"rom": "rel.rom"}, "rom"),
        ({"memory_mib": 8.5}, "memory"),
    ):
        with pytest.raises(BadVmSpec, match=f"^{field}: "):
            build_spec(host, VmOptions(name="t", **kwargs))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def consumer(hosts: dict[str, Path]) -> object:
    return discover(str(hosts["consumer-intel"]))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    name=st.from_regex(NAME_RE, fullmatch=True),
    bridge=st.from_regex(IFNAME_RE, fullmatch=True),
    network=st.from_regex(NETWORK_RE, fullmatch=True),
    vendor_id=st.from_regex(VENDOR_ID_RE, fullmatch=True),
    rom=st.from_regex(r"/[A-Za-z0-9_./ -]{1,40}", fullmatch=True),
)
def test_what_the_table_accepts_libvirt_accepts(
    consumer: object, name: str, bridge: str, network: str, vendor_id: str, rom: str
) -> None:
    """Any value the table lets through renders XML that libvirt's schema and our own
    validate accept."""
    host = consumer
    for opts in (
        VmOptions(name=name, bridge=bridge, vendor_id=vendor_id, rom=rom),
        VmOptions(name=name, network=network),
    ):
        xml = render(build_spec(host, opts))  # type: ignore[arg-type]
        findings = validate_text(xml.encode(), "prop.xml", None)
        assert not findings, [f.line() for f in findings]


# -- vm seed -----------------------------------------------------------------------------


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "id.pub"
    path.write_text(ED25519 + "\n")
    return path


def seed(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "seed.iso"
    return run("vm", "seed", *args, "-o", str(out)), out


@pytest.mark.parametrize(
    "hostname",
    [
        "g1\nlocal-hostname: evil",
        "g1\n",
        "-g1",
        "g1-",
        "g_1",
        "a..b",
        "",
        "x" * 64,
        "a." * 127 + "a",
    ],
)
def test_seed_hostname_is_a_hostname(tmp_path: Path, key: Path, hostname: str) -> None:
    r, out = seed(tmp_path, "--hostname", hostname, "--ssh-key", str(key))
    refused(r, "--hostname")
    assert not out.exists() and not Path(f"{out}.tmp").exists()


@pytest.mark.parametrize("user", ["Root", "ops\n", "a b", "x\ny", "1abc", "a" * 33, "root;rm"])
def test_seed_user_is_a_user_name(tmp_path: Path, key: Path, user: str) -> None:
    r, out = seed(tmp_path, "--hostname", "g1", "--user", user, "--ssh-key", str(key))
    refused(r, "--user")
    assert not out.exists()


@pytest.mark.parametrize(
    "content",
    [
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n",
        "ssh-ed25519 AAAAB3NzaC1yc2EAAAADAQABAAABAQ== mismatched type\n",
        "ssh-ed25519 not*base64 x\n",
        "ssh-ed25519\n",
        ED25519 + "\nlocal-hostname: evil\n",
        ED25519.replace("ops@fleet", "ops\x1b[2Jfleet") + "\n",
        "# only a comment\n",
    ],
)
def test_seed_key_file_holds_public_keys(tmp_path: Path, content: str) -> None:
    bad = tmp_path / "bad.pub"
    bad.write_text(content)
    r, out = seed(tmp_path, "--hostname", "g1", "--ssh-key", str(bad))
    refused(r, "--ssh-key")
    assert not out.exists()


def test_seed_paths(tmp_path: Path, key: Path) -> None:
    r, _ = seed(tmp_path, "--hostname", "g1", "--ssh-key", str(tmp_path))  # a directory
    refused(r, "--ssh-key")
    (tmp_path / "binary.pub").write_bytes(b"\xff\xfe\x00")
    r, _ = seed(tmp_path, "--hostname", "g1", "--ssh-key", str(tmp_path / "binary.pub"))
    refused(r, "--ssh-key")
    missing = tmp_path / "no" / "such" / "seed.iso"
    r = run("vm", "seed", "--hostname", "g1", "--ssh-key", str(key), "-o", str(missing))
    refused(r, "-o")  # the CLI's one check for every -o: the flag as typed
    assert not (tmp_path / "no").exists()
    r = run("vm", "seed", "--hostname", "g1", "--ssh-key", str(key), "-o", str(tmp_path))
    refused(r, "--output")
    r, out = seed(tmp_path, "--hostname", "gpu-1.lab.example", "--ssh-key", str(key))
    assert r.returncode == 0 and out.exists(), r.stderr


@given(
    st.from_regex(
        r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]{1,10}){0,3}", fullmatch=True
    )
)
def test_accepted_hostnames_give_exactly_two_meta_data_keys(hostname: str) -> None:
    check_hostname(hostname)  # every one of these is a host name
    assert yaml.safe_load(meta_data(hostname)) == {
        "instance-id": hostname,
        "local-hostname": hostname,
    }


@given(st.text(max_size=80))
def test_any_text_is_refused_or_stays_one_value(hostname: str) -> None:
    try:
        text = meta_data(hostname)
    except BadSeed as exc:
        assert str(exc).startswith("--hostname: ")
        return
    assert yaml.safe_load(text) == {"instance-id": hostname, "local-hostname": hostname}
