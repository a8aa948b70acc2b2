# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures: every bundled sample host built once per session as a real tree."""

from __future__ import annotations

import difflib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from passthrough import fakehost
from passthrough.journal.sandbox import chroot_argv

GOLDEN = Path(__file__).parent / "golden"

# Property tests assert outcomes, not timings: hypothesis's per-example deadline (200 ms)
# fails an example that a shared, loaded machine merely paused (seen: 372 ms once, 0.3 ms
# on the rerun), so no deadline
settings.register_profile("passthrough", deadline=None)
settings.load_profile("passthrough")
REPO = Path(__file__).parents[1]


# -- tiers: what a test needs beyond Python decides its tier (docs/testing.md) ---------------
# A bare `pytest` runs the quick tier (no root, no daemon, no Ansible run); CI runs them all
# (`pytest -m ""`). A test's tier comes from this table, its fixtures, or its own marker.
TIER_MARKERS = (
    "root",
    "libvirtd",
    "fleet",
    "umockdev",
    "realworld",
    "faults",
    "slow",
    "lab",
    "bootstacks",
)
MODULE_TIERS: dict[str, tuple[str, ...]] = {
    # real ansible-playbook / ansible-doc / ansible-test runs: seconds to minutes each
    "test_ansible.py": ("fleet",),
    "test_collection.py": ("fleet",),
    "test_kube_guest_role.py": ("fleet",),
    "test_options_ansible.py": ("fleet",),
    # the fault harness: SIGKILL at real syscalls (strace) and ENOSPC, a child process per point
    "test_faults.py": ("faults",),
    # ../shared/realworld beside the checkout (CI has it; a clone elsewhere does not)
    "test_realworld_boot.py": ("realworld",),
    "test_vgpu_realworld.py": ("realworld",),  # ../shared/realworld/vgpu captures
    "test_vgpu_after_boot.py": ("realworld",),
    "test_vgpu_heterogeneous.py": ("realworld",),
    # libvirt's own test domains, fetched by setup.sh test into the test cache
    "test_libvirt_corpus.py": ("realworld",),
    # the other boot stacks on a real boot over SSH (apply inside the booted host): tens of
    # minutes each, not in CI's run; CI boots each of them in tests/lab/test_boot_check.py
    "test_boot_stacks.py": ("lab", "bootstacks"),
    "test_upstream_grub.py": ("lab", "bootstacks"),
}
NAME_TIERS: dict[str, tuple[str, ...]] = {
    "test_guest_role_": ("fleet",),  # tests/test_guest.py: the guest role's real playbook runs
}
FIXTURE_TIERS: dict[str, tuple[str, ...]] = {
    "libvirtd": ("libvirtd", "root"),  # the real daemon, started as root
    "debian_tree": ("slow", "root"),  # debootstrap, chroot and mounts
}


def tiers_of(item: pytest.Item) -> set[str]:
    module = getattr(item, "path", Path(str(item.fspath))).name
    tiers = set(MODULE_TIERS.get(module, ()))
    for prefix, names in NAME_TIERS.items():
        if item.name.startswith(prefix):
            tiers.update(names)
    for fixture in getattr(item, "fixturenames", ()):
        tiers.update(FIXTURE_TIERS.get(fixture, ()))
    tiers.update(m for m in TIER_MARKERS if item.get_closest_marker(m) is not None)
    return tiers


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """The quick tier runs on every core (`-n auto` in pyproject's addopts); any other tier
    selection runs in one process. The slower tiers share one libvirtd, one lab VM, one
    tmpfs mount point and real Ansible runs that are not safe to run side by side; a
    contributor who wants workers there passes `-n` after `-p xdist` by hand and owns it.
    The quick tier gets its temporary trees on a tmpfs and a bytecode cache (below)."""
    if config.getoption("markexpr") == "quick":
        quick_tier_setup(os.environ, basetemp_given=config.option.basetemp is not None)
    elif config.pluginmanager.hasplugin("xdist"):
        config.option.numprocesses = 0
        config.option.dist = "no"
        config.option.tx = []


# The quick tier's two measured costs beyond the tests' own work (docs/testing.md, "Time"):
# the files its tests write (host trees copied into `tmp_path`: on this machine's ext4 each
# create costs 70-330 us of system time, on a tmpfs about 10 times less), and the bytecode an
# interpreter compiles when PYTHONDONTWRITEBYTECODE forbids caching it (each pytest worker
# and each real `python -m passthrough` a test starts: about 0.25 s of CPU a start).
QUICK_TEMPROOT = "/dev/shm"
QUICK_TEMPROOT_FREE = 2 << 30  # bytes free on it, at least (a run holds up to ~600 MB there)


def is_tmpfs(path: str, mounts: str = "/proc/self/mounts", need: int = QUICK_TEMPROOT_FREE) -> bool:
    """Whether ``path`` is a tmpfs mount point this process may write into, with ``need``
    bytes free."""
    try:
        with open(mounts, encoding="utf-8") as f:
            found = any(line.split()[1:3] == [path, "tmpfs"] for line in f)
    except OSError:
        return False
    if not (found and os.access(path, os.W_OK | os.X_OK)):
        return False
    # room for a run's trees: a container's default /dev/shm (64 MiB) has not
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize >= need


def quick_tier_setup(
    environ: MutableMapping[str, str], basetemp_given: bool, mounts: str = "/proc/self/mounts"
) -> None:
    """For the quick tier, in the process that starts the workers (they and every process a
    test starts inherit ``environ``): ``tmp_path`` trees on a tmpfs unless a temporary
    directory was chosen (``--basetemp``, ``TMPDIR``, ``PYTEST_DEBUG_TEMPROOT``), and bytecode
    kept in the checkout's ``.pytest_cache/pycache`` (``PYTHONPYCACHEPREFIX``), never beside
    the sources, even where ``PYTHONDONTWRITEBYTECODE`` is set."""
    if "PYTEST_XDIST_WORKER" in environ:
        return  # a worker: its controller chose, and its base directory is given to it
    chosen = {"TMPDIR", "PYTEST_DEBUG_TEMPROOT"} & set(environ)
    if not basetemp_given and not chosen and is_tmpfs(QUICK_TEMPROOT, mounts):
        environ["PYTEST_DEBUG_TEMPROOT"] = QUICK_TEMPROOT
    environ.pop("PYTHONDONTWRITEBYTECODE", None)
    prefix = environ.setdefault("PYTHONPYCACHEPREFIX", str(REPO / ".pytest_cache" / "pycache"))
    sys.dont_write_bytecode = False  # this process's test modules (`-n 0`), too
    sys.pycache_prefix = prefix


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test gets its tier markers, and `quick` when it has none; the lab runs last:
    after the unit and integration suites, as CI wants it (a failure there is then not the
    first thing to read when something simpler broke)."""
    for item in items:
        tiers = tiers_of(item)
        for tier in sorted(tiers):
            item.add_marker(tier)
        if not tiers:
            item.add_marker("quick")
    items.sort(key=lambda item: item.get_closest_marker("lab") is not None)


# Beside CI's lab tier (scripts/setup.sh test names the file): while the lab's nested guest
# boots (lab/labcore.py `alone`, the file holding the lab's process id) no test starts here, and
# the tests already running finish. TCG inside TCG slows down three- to fourfold beside any
# busy thread, even at nice 19 (docs/lab.md); the wait ends when the file goes, when the
# process named in it is gone, or after LAB_ALONE_LIMIT seconds. Each wait is logged to
# the file's name plus ".log", which setup.sh prints.
LAB_ALONE = "PASSTHROUGH_LAB_ALONE"
LAB_ALONE_LIMIT = 2400  # the nested stage's own limit is 2,100 s


def wait_for_the_lab(path: str, limit: float = LAB_ALONE_LIMIT, poll: float = 2.0) -> float:
    """Seconds waited while ``path`` names a live process that wants the machine alone."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        try:
            pid = int(Path(path).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            break  # no file (the usual case), or one being written: go on
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break  # left behind by a lab that died
        except PermissionError:
            pass  # alive, someone else's
        time.sleep(poll)
    return time.monotonic() - started


def pytest_runtest_setup(item: pytest.Item) -> None:
    path = os.environ.get(LAB_ALONE)
    if not path:
        return
    waited = wait_for_the_lab(path)
    if waited >= 1:
        with open(f"{path}.log", "a", encoding="utf-8") as log:
            log.write(f"{time.strftime('%H:%M:%S')} waited {waited:.0f} s before {item.nodeid}\n")


@pytest.fixture(scope="session")
def libvirtd() -> str:
    """The real libvirtd with the QEMU driver (scripts/libvirtd-up.sh starts it once): the
    one fixture every libvirtd test uses."""
    assert os.geteuid() == 0, "the real libvirtd tests need root (CI runs as root)"
    assert shutil.which("/usr/sbin/libvirtd"), (
        "libvirt-daemon is required (scripts/setup.sh test installs it)"
    )
    subprocess.run(
        ["bash", str(REPO / "scripts/libvirtd-up.sh")], check=True, capture_output=True, timeout=60
    )
    return "qemu:///system"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--regenerate-golden",
        action="store_true",
        help="rewrite golden files from the current output instead of comparing",
    )


@pytest.fixture(scope="session")
def regenerate(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--regenerate-golden"))


@pytest.fixture(scope="session", autouse=True)
def quick_tier_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Where the quick tier's trees are on the tmpfs (quick_tier_setup), the temporary files
    of the commands under test go there too: ``TMPDIR`` (an archive a command unpacks, a
    file it stages) is a directory of the run's own, removed with it."""
    if os.environ.get("PYTEST_DEBUG_TEMPROOT") != QUICK_TEMPROOT or "TMPDIR" in os.environ:
        yield
        return
    os.environ["TMPDIR"] = str(tmp_path_factory.mktemp("TMPDIR"))
    tempfile.tempdir = None  # read again from TMPDIR
    try:
        yield
    finally:
        del os.environ["TMPDIR"]
        tempfile.tempdir = None


@pytest.fixture(scope="session")
def hosts(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[str, Path]:
    """Every sample host as a real tree, read-only to the tests. Built once per run: the
    first pytest-xdist worker to get here builds them under the run's shared temporary
    directory while the others wait on its lock, then all read the same trees."""
    import fcntl

    names = fakehost.sample_names()
    if worker_id == "master":  # no xdist: this process alone
        base = tmp_path_factory.mktemp("hosts")
        return {name: fakehost.build(fakehost.load(name), base / name) for name in names}
    base = tmp_path_factory.getbasetemp().parent / "hosts"
    base.mkdir(exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (base / ".built").exists():
            for name in names:
                fakehost.build(fakehost.load(name), base / name)
            (base / ".built").write_text("\n".join(names) + "\n")
    return {name: base / name for name in names}


def assert_golden(path: Path, got: str, regenerate: bool, what: str) -> None:
    """Compare ``got`` with a golden file (a unified diff on mismatch); write it instead
    with ``pytest --regenerate-golden``, then review the change in the git diff."""
    if regenerate or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
        if not regenerate:
            pytest.fail(f"golden file {path} was missing; written now, review and commit it")
    want = path.read_text()
    if got != want:
        diff = "".join(
            difflib.unified_diff(want.splitlines(True), got.splitlines(True), str(path), what)
        )
        pytest.fail(
            f"{what} differs from {path} (rerun with --regenerate-golden if intended):\n{diff}"
        )


def tree_hash(root: Path) -> str:
    """Every path under ``root`` with its content or link target (directories by name): two
    equal hashes mean nothing under the root was written, removed or relinked."""
    import hashlib

    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            h.update(str(p.relative_to(root)).encode() + b"\0")
            if p.is_symlink():
                h.update(b"L" + os.readlink(p).encode())
            elif p.is_file():
                _hash_content(h, p)
    return h.hexdigest()


def _hash_content(h: Any, path: Path, chunk: int = 1 << 20) -> None:
    """A file's size and every byte of its data, each run with its offset, into ``h``: the
    holes of a sparse file (the hostile tests' 3 GiB one) are skipped, not read as zeros (a
    write into one makes it data, and changes the hash)."""
    with open(path, "rb") as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        h.update(b"F%d\0" % size)
        pos = 0
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole from here to the end
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            h.update(b"@%d\0" % start)
            f.seek(start)
            while start < end:
                data = f.read(min(chunk, end - start))
                if not data:
                    break
                h.update(data)
                start += len(data)
            pos = end


def build_variant(tmp_path: Path, name: str, **overrides: object) -> Path:
    """A sample host with top-level keys of its description replaced."""
    desc = fakehost.load(name)
    data = dict(desc.data)
    data.update(overrides)
    return fakehost.build(fakehost.Description(data, f"{name}+variant"), tmp_path / "root")


# -- a real Debian 12 tree, debootstrapped once and cached outside the repository ----------
CACHE = Path(os.environ.get("PASSTHROUGH_TEST_CACHE", "/var/cache/passthrough-test"))
MIRROR = os.environ.get(
    "PASSTHROUGH_DEBIAN_MIRROR", "http://deb.debian.org/debian"
)  # in RECIPE: the cache key
PACKAGES = "linux-image-amd64,grub-efi-amd64-bin,grub2-common,initramfs-tools,kmod,udev,python3,python3-apt"
RECIPE = f"debootstrap --variant=minbase --include={PACKAGES} bookworm {MIRROR}; grub default from template; update-grub"


def run_ok(argv: list[str], timeout: int = 900) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(argv)}: {r.stderr[-2000:]}"
    return r


def _lab_image() -> Any:
    """lab/image.py (test infrastructure, not part of the package)."""
    spec = importlib.util.spec_from_file_location(
        "passthrough_lab_image", REPO / "lab" / "image.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def debian_tree() -> Path:
    assert os.geteuid() == 0, "this test runs chroot and mounts: run the suite as root (CI does)"
    assert shutil.which("debootstrap"), (
        "debootstrap is required (scripts/setup.sh test installs it)"
    )

    def prepare(tmp: Path) -> None:
        # what grub-pc's postinst would do on a real install
        shutil.copy(tmp / "usr/share/grub/default/grub", tmp / "etc/default/grub")
        (tmp / "boot/grub").mkdir(parents=True, exist_ok=True)
        run_ok(chroot_argv(str(tmp), ("update-grub",)))

    tree: Path = _lab_image().cached_debootstrap(CACHE, "bookworm", PACKAGES, RECIPE, prepare)
    return tree


def bind_to_vfio(root: Path, addr: str) -> None:
    """What a reboot into a prepared host does to one function: its driver link and uevent
    say vfio-pci (the test writes them in place of the kernel — a stand-in named as such)."""
    real = (root / "sys/bus/pci/devices" / addr).resolve()
    (real / "driver").unlink(missing_ok=True)
    (real / "driver").symlink_to(os.path.relpath(root / "sys/bus/pci/drivers/vfio-pci", real))
    uevent = real / "uevent"
    lines = [ln for ln in uevent.read_text().splitlines() if not ln.startswith("DRIVER=")]
    uevent.write_text("".join(f"{ln}\n" for ln in [*lines, "DRIVER=vfio-pci"]))
