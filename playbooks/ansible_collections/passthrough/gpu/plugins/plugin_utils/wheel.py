# SPDX-License-Identifier: Apache-2.0
# Apache-2.0 (see the passthrough project's LICENSE)
"""The controller's passthrough as the hosts get it: its identity (version and a hash of its
content) and its wheel, built from the checkout the collection sits in or packed from the
installed distribution (plugin_utils/runtime.py installs it on a host that lacks it)."""

from __future__ import annotations

import base64
import fcntl
import hashlib
import importlib.metadata
import os
import stat
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ansible.errors import AnsibleError

HERE = Path(__file__).resolve()
# plugins/plugin_utils/wheel.py → the collection → ansible_collections → its parent
PARENT = HERE.parents[5]
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "passthrough/wheels"


def _checkout() -> Path | None:
    """The passthrough checkout this collection sits in (playbooks/ansible_collections/…)."""
    repo = PARENT.parent
    if (repo / "pyproject.toml").is_file() and (repo / "passthrough/__init__.py").is_file():
        return repo
    return None


def _installed() -> importlib.metadata.Distribution | None:
    """The installed passthrough distribution the collection came in (passthrough/data/…), or
    the one the controller's Python imports."""
    try:
        return importlib.metadata.distribution("passthrough")
    except importlib.metadata.PackageNotFoundError:
        return None


def _version(repo: Path) -> str:
    for line in (repo / "passthrough/__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise AnsibleError(f"no __version__ in {repo}/passthrough/__init__.py")


def _sources(repo: Path) -> list[tuple[Path, os.stat_result]]:
    """The checkout's files that go onto the hosts, in a fixed order, with their stat."""
    found = []
    for tree in ("passthrough", "templates"):
        for top, dirs, names in os.walk(repo / tree):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in names:
                path = Path(top, name)
                st = path.stat()
                if stat.S_ISREG(st.st_mode):
                    found.append((path, st))
    return sorted(found, key=lambda f: f[0])


def identity() -> str:
    """``VERSION+sha256`` of what goes onto the hosts: a checkout's package and templates, or
    an installed distribution's RECORD (which lists every file with its hash).

    A checkout's content hash is kept in the cache under a key made of every file's name,
    size, inode and modification and change times: each host's task asks (a worker process
    each), and stating the files costs a fraction of reading and hashing them all again."""
    repo = _checkout()
    digest = hashlib.sha256()
    if repo is not None:
        sources = _sources(repo)
        key = hashlib.sha256(str(repo).encode())
        for path, st in sources:
            stamp = (st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
            key.update(f"{path.relative_to(repo)}\0{stamp}\0".encode())
        cached = CACHE.parent / "identity" / key.hexdigest()
        try:
            return cached.read_text()
        except OSError:
            pass
        for path, _st in sources:
            digest.update(str(path.relative_to(repo)).encode() + b"\0")
            digest.update(path.read_bytes())
        found = f"{_version(repo)}+{digest.hexdigest()[:16]}"
        try:  # written whole or not at all: a fork reading it sees no half
            cached.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=cached.parent, delete=False) as tmp:
                tmp.write(found)
            os.replace(tmp.name, cached)
        except OSError:
            pass  # no cache: the next host hashes again
        return found
    dist = _installed()
    if dist is None:
        raise AnsibleError(
            "no passthrough on the controller: set passthrough_runtime_wheel or "
            "passthrough_runtime_index_url"
        )
    digest.update((dist.read_text("RECORD") or "").encode())
    return f"{dist.version}+{digest.hexdigest()[:16]}"


def _pack(dist: importlib.metadata.Distribution, out: Path) -> Path:
    """A wheel of an installed pure-Python distribution, from its RECORD."""
    base = Path(str(dist.locate_file("")))
    name = f"passthrough-{dist.version}-py3-none-any.whl"
    records: list[str] = []
    with zipfile.ZipFile(out / name, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in dist.files or []:
            rel = str(f)
            if rel.startswith("..") or "__pycache__" in rel or rel.endswith("/RECORD"):
                continue
            data = (base / rel).read_bytes()
            zf.writestr(rel, data)
            sha = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            records.append(f"{rel},sha256={sha},{len(data)}")
        info = next(
            str(f).split("/", maxsplit=1)[0] for f in dist.files or [] if ".dist-info/" in str(f)
        )
        records.append(f"{info}/RECORD,,")
        zf.writestr(f"{info}/RECORD", "\n".join(records) + "\n")
    return out / name


def wheel(ident: str) -> Path:
    """The controller's wheel for ``ident``, built once and cached (a lock keeps the forks from
    building it side by side)."""
    folder = CACHE / ident
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = sorted(folder.glob("passthrough-*.whl"))
        if found:
            return found[0]
        repo = _checkout()
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            if repo is None:
                dist = _installed()
                if dist is None:  # identity() raised otherwise
                    raise RuntimeError("passthrough is neither a checkout nor installed here")
                built = _pack(dist, Path(tmp))
            else:
                built = _build(repo, Path(tmp))
            return built.rename(folder / built.name)


def _build(repo: Path, out: Path) -> Path:
    base = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out)]
    errors = []
    # without build isolation when setuptools is at hand (no index needed), else with it
    for extra in (["--no-build-isolation"], []):
        r = subprocess.run([*base, *extra, str(repo)], capture_output=True, text=True, check=False)
        found = list(out.glob("passthrough-*.whl"))
        if r.returncode == 0 and found:
            return found[0]
        errors.append((r.stderr or r.stdout).strip().splitlines()[-1:])
    raise AnsibleError(
        f"could not build the passthrough wheel from {repo} ({errors}); "
        "set passthrough_runtime_wheel to a wheel"
    )
