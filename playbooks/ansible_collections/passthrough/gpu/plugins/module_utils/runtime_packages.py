# SPDX-License-Identifier: Apache-2.0
# Apache-2.0 (see the passthrough project's LICENSE)
"""The distro packages that give the passthrough runtime on a host what it imports from the
system: stdlib only, so it runs on a bare host's python3 before anything is installed.

The passthrough package itself goes into a venv of its own (passthrough_runtime); the compiled
bindings (libvirt above all) come from the distro, seen through the venv's system site
packages, rather than being compiled on every host."""

from __future__ import annotations

import importlib.util

# Python module -> package name per family (os-release ID / ID_LIKE)
PACKAGES: dict[str, dict[str, str]] = {
    "libvirt": {
        "debian": "python3-libvirt",
        "redhat": "python3-libvirt",
        "arch": "libvirt-python",
        "suse": "python3-libvirt-python",
    },
    "lxml": {
        "debian": "python3-lxml",
        "redhat": "python3-lxml",
        "arch": "python-lxml",
        "suse": "python3-lxml",
    },
    "jinja2": {
        "debian": "python3-jinja2",
        "redhat": "python3-jinja2",
        "arch": "python-jinja",
        "suse": "python3-Jinja2",
    },
    "yaml": {
        "debian": "python3-yaml",
        "redhat": "python3-pyyaml",
        "arch": "python-yaml",
        "suse": "python3-PyYAML",
    },
    # the venv module's ensurepip, only for installing from an index (pip in the venv)
    "ensurepip": {
        "debian": "python3-venv",
        "redhat": "python3",
        "arch": "python",
        "suse": "python3",
    },
}
FAMILIES = {
    "debian": "debian",
    "ubuntu": "debian",
    "rhel": "redhat",
    "fedora": "redhat",
    "centos": "redhat",
    "rocky": "redhat",
    "almalinux": "redhat",
    "arch": "arch",
    "suse": "suse",
    "opensuse": "suse",
    "sles": "suse",
}
INSTALL = {
    "debian": ["apt-get", "install", "-y", "--no-install-recommends"],
    "redhat": ["dnf", "install", "-y"],
    "arch": ["pacman", "-S", "--noconfirm", "--needed"],
    "suse": ["zypper", "--non-interactive", "install"],
}


def family(os_release: str = "/etc/os-release") -> str | None:
    """debian, redhat, arch or suse, from ID then ID_LIKE; None when none is known."""
    fields: dict[str, str] = {}
    try:
        with open(os_release, encoding="utf-8", errors="replace") as f:
            for line in f.read(65536).splitlines():
                key, sep, value = line.partition("=")
                if sep:
                    fields[key.strip()] = value.strip().strip("\"'")
    except OSError:
        return None
    for word in [fields.get("ID", ""), *fields.get("ID_LIKE", "").split()]:
        for name, fam in FAMILIES.items():
            if word == name or word.startswith(name + "-"):
                return fam
    return None


def package(module: str, fam: str | None) -> str:
    """The package that provides ``module`` on family ``fam`` (its Python name otherwise)."""
    names = PACKAGES.get(module.split(".")[0], {})
    return names.get(fam or "", "") or f"the Python module {module.split('.')[0]}"


def missing(modules: list[str]) -> list[str]:
    """The modules of ``modules`` this interpreter cannot import."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


# The kernel reads a script's ``#!`` line into a buffer of 256 bytes (BINPRM_BUF_SIZE, Linux
# 5.1 and later) and ends the interpreter's path at the first space or tab: a venv whose
# bin/python does not fit whole is one no console script (nor Ansible's module) can name.
SHEBANG_BYTES = 255


def shebang_refusal(venv: str) -> str | None:
    """Why ``venv``/bin/python cannot stand in a ``#!`` line; None: it can."""
    line = f"#!{venv}/bin/python"
    odd = sorted({c for c in venv if c.isspace() or not c.isprintable()})
    if odd:
        return (
            f"venv {venv!r}: holds {', '.join(repr(c) for c in odd)}, which a #! line cannot "
            "hold: choose a path without spaces or control characters; nothing changed"
        )
    if len(line.encode("utf-8", "surrogateescape")) > SHEBANG_BYTES:
        return (
            f"venv {venv[:60]}...: {venv}/bin/python is longer than a #! line holds "
            f"({SHEBANG_BYTES} bytes); nothing changed"
        )
    return None
