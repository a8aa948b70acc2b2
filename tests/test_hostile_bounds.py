# SPDX-License-Identifier: Apache-2.0
"""Issue 19 item 4: every reader has a bound (docs/limits.md).

Each hostile input runs through the real CLI in a subprocess with an address-space limit
(RLIMIT_AS) and a timeout, and must end with exit 2 and one line naming the limit, within
the time bound, with nothing changed outside its temporary directory (the ``outside``
fixture's tree and the reading machine's files, the TMPDIR a snapshot unpacks into, and
the input itself)."""

from __future__ import annotations

import gzip
import os
import resource
import shutil
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from passthrough.guest.runner import MAX_RECORDING
from passthrough.host.root import MAX_FILE
from passthrough.host.unpack import LIMITS

from .conftest import build_variant, tree_hash
from .test_hostile_contain import one_error_line, outside, tree  # noqa: F401 (a fixture)

PT = [sys.executable, "-m", "passthrough"]
MEMORY = 768 << 20  # address space for the whole CLI process (Python, lxml, libvirt-python)
SECONDS = 20.0  # wall time allowed per hostile input (two shared cores, imports included)
GUEST = Path(__file__).parent / "fixtures/h100-guest"


def bounded(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """The CLI under RLIMIT_AS and a timeout, unpacking into its own TMPDIR (checked empty)."""
    unpack_here = tmp_path / "tmpdir"
    unpack_here.mkdir(exist_ok=True)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))

    start = time.monotonic()
    r = subprocess.run(
        [*PT, *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=SECONDS * 3,  # a hang fails here; the bound itself is asserted below
        env={**os.environ, "TMPDIR": str(unpack_here)},
        preexec_fn=limit,
    )
    took = time.monotonic() - start
    assert list(unpack_here.iterdir()) == [], "a temporary file or directory was left"
    return r, took


def refused(r: subprocess.CompletedProcess[str], took: float, *words: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    line = one_error_line(r)
    for word in words:
        assert word in line, (word, line)
    assert took < SECONDS, f"took {took:.1f}s"
    return line


def test_a_normal_run_fits_the_memory_bound(tmp_path: Path) -> None:
    """The bound is not what refuses: the real snapshot scans fine under it."""
    r, took = bounded(tmp_path, "scan", "--root", str(GUEST / "snapshot.tar.gz"), "--json")
    assert r.returncode == 0, r.stderr
    assert took < SECONDS


# -- snapshot archives ----------------------------------------------------------------


def _gz(path: Path, raw: bytes, level: int = 6) -> Path:
    path.write_bytes(gzip.compress(raw, compresslevel=level))
    return path


def _header(name: str, size: int = 0, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.mode = size, kind, 0o644
    return info.tobuf(
        format=tarfile.USTAR_FORMAT if kind == tarfile.REGTYPE else tarfile.PAX_FORMAT
    )


def _many_members(path: Path) -> Path:
    """One more empty file than allowed, 1.2 MiB-ish of gzip (the reported shape: 200k)."""
    headers = b"".join(_header(f"d{i % 100}/f{i}") for i in range(LIMITS.members + 1))
    return _gz(path, headers + b"\0" * 1024, level=1)


def _deep(path: Path) -> Path:
    name = "/".join(["d"] * (LIMITS.depth + 1))
    return _gz(path, _header(name) + b"\0" * 1024)


def _declared_huge(path: Path) -> Path:
    """A member that says it holds 5 GiB (the reported 4 MB archive writing 4 GB)."""
    return _gz(path, _header("sys/big", size=5 << 30) + b"\0" * 4096)


def _zeros(path: Path) -> Path:
    """8 MiB of zeros in 8 KiB: a compression ratio of about 1000."""
    size = 8 << 20
    return _gz(path, _header("sys/zeros", size=size) + b"\0" * (size + 1024), level=9)


def _pax_bomb(path: Path) -> Path:
    """A pax extended header of 100 MiB: tarfile reads a header whole, before any filter."""
    size = 100 << 20
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = tarfile.XHDTYPE, size
    head = info.tobuf(format=tarfile.USTAR_FORMAT)
    return _gz(path, head + b"\0" * size + _header("x") + b"\0" * 1024, level=1)


ARCHIVES = {
    "members": (_many_members, f"more than {LIMITS.members} members"),
    "depth": (_deep, f"deeper than {LIMITS.depth} levels"),
    "declared-size": (_declared_huge, f"larger than {LIMITS.bytes >> 20} MiB in all"),
    "ratio": (_zeros, f"expands more than {LIMITS.ratio} times"),
    # zeros at gzip's fastest level shrink less than 200 times: the byte budget stops it
    "pax-header": (_pax_bomb, f"more than {LIMITS.bytes >> 20} MiB uncompressed"),
}


@pytest.mark.parametrize("case", sorted(ARCHIVES))
def test_an_archive_past_a_limit_is_refused_naming_it(
    case: str,
    tmp_path: Path,
    outside: Path,  # noqa: F811 (the fixture)
) -> None:
    make, limit = ARCHIVES[case]
    evil = make(tmp_path / "evil.tar.gz")
    before = tree(evil)
    r, took = bounded(tmp_path, "scan", "--root", str(evil))
    refused(r, took, limit, str(evil))
    assert tree(evil) == before


def test_the_limits_leave_room_for_a_large_host(tmp_path: Path, hosts: dict[str, Path]) -> None:
    """A capture of the 8-GPU HGX sample is far inside every limit and scans back."""
    out = tmp_path / "hgx.tar.gz"
    assert (
        subprocess.run(
            [*PT, "snapshot", "--root", str(hosts["hgx-h100"]), "-o", str(out)],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )
    with tarfile.open(out) as tar:
        members = tar.getmembers()
    assert len(members) * 10 < LIMITS.members
    raw = len(gzip.decompress(out.read_bytes()))
    assert raw * 10 < LIMITS.bytes and raw < LIMITS.ratio * out.stat().st_size
    r, took = bounded(tmp_path, "scan", "--root", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert took < SECONDS


# -- YAML in spec files ---------------------------------------------------------------

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)


@pytest.mark.parametrize(
    "text",
    [BOMB, "base: &b {vcpus: 2}\n<<: *b\n", "name: &n vm1\nnetwork: *n\n"],
    ids=["billion-laughs", "merge-key", "plain-alias"],
)
def test_a_spec_with_aliases_is_refused(
    text: str,
    tmp_path: Path,
    hosts: dict[str, Path],
    outside: Path,  # noqa: F811
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    assert len(BOMB) < 1024  # a few hundred bytes that would expand to 9**9 strings
    root_before = tree_hash(hosts["consumer-intel"])
    out = tmp_path / "out.xml"
    r, took = bounded(
        tmp_path,
        "render",
        "--root",
        str(hosts["consumer-intel"]),
        "--spec",
        str(spec),
        "-o",
        str(out),
    )
    refused(r, took, "aliases", str(spec))
    assert not out.exists()
    assert tree_hash(hosts["consumer-intel"]) == root_before


# -- guest check --commands DIR ---------------------------------------------------------


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    dest = tmp_path / "commands"
    shutil.copytree(GUEST / "commands", dest)
    return dest


def _listing(path: Path) -> dict[str, tuple[int, int, int]]:
    """Each entry's type and mode, size and mtime, never opened (a FIFO would block)."""
    return {
        p.name: (st.st_mode, st.st_size, st.st_mtime_ns)
        for p in sorted(path.iterdir())
        for st in [p.lstat()]
    }


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _huge(path: Path) -> None:
    with path.open("wb") as fh:
        fh.truncate(MAX_RECORDING + 1)  # sparse: cheap to make, costly to read whole


def _directory(path: Path) -> None:
    path.mkdir()


RECORDINGS = {
    "fifo": (_fifo, "not a regular file"),
    "dev-zero": (_zero, "not a regular file"),
    "oversized": (_huge, f"larger than {MAX_RECORDING >> 20} MiB"),
    "directory": (_directory, "not a regular file"),
}


@pytest.mark.parametrize("name", ["dmesg.txt", "nvidia-smi-q.xml"])
@pytest.mark.parametrize("case", sorted(RECORDINGS))
def test_a_recording_that_is_no_regular_file_is_refused(
    case: str,
    name: str,
    tmp_path: Path,
    recorded: Path,
    outside: Path,  # noqa: F811
) -> None:
    make, why = RECORDINGS[case]
    target = recorded / name
    target.unlink()
    make(target)
    before = _listing(recorded)
    r, took = bounded(
        tmp_path,
        "guest",
        "check",
        "--root",
        str(GUEST / "root.tar.gz"),
        "--commands",
        str(recorded),
        "--no-compute",
    )
    refused(r, took, "--commands", name, why)
    assert _listing(recorded) == before


# -- config files over the size cap ---------------------------------------------------


@pytest.mark.parametrize("command", ["plan", "apply"])
def test_a_config_file_over_the_cap_is_refused_not_cut(
    command: str,
    tmp_path: Path,
    outside: Path,  # noqa: F811
) -> None:
    host = build_variant(tmp_path, "consumer-intel")
    grub = host / "etc/default/grub"
    with grub.open("a") as fh:  # the admin's settings, then a long comment past the cap
        fh.write("# " + "x" * MAX_FILE + "\n")
    size, before = grub.stat().st_size, tree_hash(host)
    r, took = bounded(tmp_path, command, "--root", str(host))
    refused(r, took, "etc/default/grub", f"larger than {MAX_FILE >> 20} MiB")
    assert grub.stat().st_size == size
    assert tree_hash(host) == before


@pytest.mark.parametrize("reader", ["validate-config", "host-description", "kubevirt-manifest"])
def test_every_yaml_reader_refuses_aliases(reader: str, tmp_path: Path) -> None:
    """The other YAML readers a user feeds (validate's config, a host description, KubeVirt
    manifests) refuse the same alias bomb in one line, within the same bounds."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)
    domain = tmp_path / "d.xml"
    domain.write_text("<domain type='kvm'><name>d</name></domain>\n")
    argv = {
        "validate-config": ["validate", "--config", str(bomb), str(domain)],
        "host-description": ["sample", "build", str(bomb), str(tmp_path / "built")],
        "kubevirt-manifest": ["kubevirt", "validate", str(bomb)],
    }[reader]
    r, took = bounded(tmp_path, *argv)
    # a description may share entries through aliases (the samples do): bounded, not refused
    refused(r, took, "expand past" if reader == "host-description" else "aliases", str(bomb))
    assert not (tmp_path / "built").exists()


# -- paths the journal names (status, undo) and files apply is about to write -----------


def _char_device(path: Path) -> None:
    os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # what /dev/zero is


def _sparse_3g(path: Path) -> None:
    with path.open("wb") as fh:
        fh.truncate(3 << 30)  # sparse: nothing on the disk, 3 GiB to a reader


JOURNALED = {
    "fifo": (_fifo, "a FIFO, not a regular file"),
    "char-device": (_char_device, "a character device, not a regular file"),
    "sparse-3g": (_sparse_3g, f"larger than {MAX_FILE >> 20} MiB"),
}


def _plant(path: Path, case: str) -> None:
    if case == "char-device" and os.geteuid() != 0:
        pytest.skip("mknod needs root (the root tier runs it)")
    path.unlink(missing_ok=True)
    JOURNALED[case][0](path)


@pytest.mark.parametrize("command", ["status", "undo"])
@pytest.mark.parametrize("case", sorted(JOURNALED))
def test_a_journaled_path_that_is_no_regular_file_is_refused(
    case: str,
    command: str,
    tmp_path: Path,
    outside: Path,  # noqa: F811
) -> None:
    """Issue 30: where the journal names a file, a FIFO hung status and undo, and a 3 GiB
    file gave a MemoryError traceback. Now: one line, exit 2, in time, under the memory
    bound, from the file's lstat (never opened), and undo changes nothing."""
    host = build_variant(tmp_path, "consumer-intel")
    r = subprocess.run([*PT, "apply", "--root", str(host)], capture_output=True, check=False)
    assert r.returncode == 0, r.stderr
    target = host / "etc/modprobe.d/passthrough-vfio.conf"
    _plant(target, case)
    before = _listing(target.parent), tree_hash(host / "var")
    r, took = bounded(tmp_path, command, "--root", str(host))
    refused(r, took, "etc/modprobe.d/passthrough-vfio.conf", JOURNALED[case][1])
    assert (_listing(target.parent), tree_hash(host / "var")) == before


@pytest.mark.parametrize("case", sorted(JOURNALED))
def test_apply_refuses_a_target_that_is_no_regular_file(
    case: str,
    tmp_path: Path,
    outside: Path,  # noqa: F811
) -> None:
    """A FIFO where a config file should be hung apply while it held the lock: refused
    before anything is made (no state directory, no lock, no journal)."""
    host = build_variant(tmp_path, "consumer-intel")
    target = host / "etc/initramfs-tools/modules"
    _plant(target, case)
    before = _listing(target.parent), tree_hash(host)
    r, took = bounded(tmp_path, "apply", "--root", str(host))
    refused(r, took, "etc/initramfs-tools/modules", JOURNALED[case][1])
    assert (_listing(target.parent), tree_hash(host)) == before
    assert not (host / "var/lib/passthrough").exists()


# -- nesting: YAML and JSON 1,000 levels deep -------------------------------------------

DEEP = "[" * 1000 + "]" * 1000


def _deep_yaml(tmp_path: Path, head: str) -> str:
    path = tmp_path / "deep.yaml"
    path.write_text(f"{head}{DEEP}\n")
    return str(path)


@pytest.mark.parametrize(
    ("argv", "head", "what"),
    [
        (["render", "--spec"], "name: ", "a VM spec file"),
        (["kubevirt", "render", "--spec"], "name: ", "a VM spec file"),
        (["kubevirt", "validate"], "apiVersion: v1\nkind: ConfigMap\ndata: ", "a manifest"),
        (["sample", "build"], "pci: ", "a host description"),
    ],
    ids=["render", "kubevirt-render", "kubevirt-validate", "sample-build"],
)
def test_yaml_nested_a_thousand_deep_is_refused(
    argv: list[str],
    head: str,
    what: str,
    tmp_path: Path,
    outside: Path,  # noqa: F811
) -> None:
    """Issue 30: PyYAML composes recursively, so 1,000 nested ``[`` gave a RecursionError
    traceback. Refused at the 101st level: one line naming the line and the limit."""
    from passthrough.inputs import MAX_DEPTH

    path = _deep_yaml(tmp_path, head)
    extra = [str(tmp_path / "out")] if argv == ["sample", "build"] else []
    r, took = bounded(tmp_path, *argv, path, *extra)
    refused(r, took, f"nested deeper than {MAX_DEPTH} levels: not {what}")
    assert not (tmp_path / "out").exists()


def test_kernelstub_json_nested_deep_is_refused(
    tmp_path: Path,
    outside: Path,  # noqa: F811
) -> None:
    """A kernelstub configuration nested past what json reads: one line, no traceback."""
    host = build_variant(tmp_path, "consumer-intel", distro="popos-22.04")
    config = host / "etc/kernelstub/configuration"
    config.write_text('{"user": {"kernel_options": ' + "[" * 100_000 + "]" * 100_000 + "}}")
    before = tree_hash(host)
    r, took = bounded(tmp_path, "apply", "--root", str(host))
    refused(r, took, "/etc/kernelstub/configuration", "is not the JSON kernelstub writes")
    assert tree_hash(host) == before


def test_a_spec_that_is_a_fifo_is_refused(
    tmp_path: Path,
    outside: Path,  # noqa: F811
) -> None:
    """``render --spec FIFO`` waited for a writer forever."""
    spec = tmp_path / "spec.yaml"
    os.mkfifo(spec)
    r, took = bounded(tmp_path, "render", "--spec", str(spec))
    refused(r, took, "spec.yaml", "not a regular file")


def test_the_bounded_yaml_loader_class_is_built_once() -> None:
    """Every YAML input (spec files, layouts, inventories) subclasses one bounded loader:
    built on the first read, not again on each (a class and its resolver tables a read)."""
    from passthrough.inputs import depth_bounded

    assert depth_bounded() is depth_bounded()
