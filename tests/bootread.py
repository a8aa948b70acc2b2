# SPDX-License-Identifier: Apache-2.0
"""The boot tools' own reading of their configuration, for tests.

Files that others wrote may run commands when sourced (``lsb_release``, ``lspci``): they
are sourced with ``env -i`` in a temporary directory, with stand-ins first on PATH.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .conftest import run_ok

STANDINS = {
    "lsb_release": "#!/bin/sh\necho Debian\n",
    "lspci": "#!/bin/sh\necho '01:00.0 VGA compatible controller: NVIDIA Corporation'\n",
}


def _bash(script: str, tmp: Path) -> str:
    bindir = tmp / "standins"
    bindir.mkdir(exist_ok=True)
    for name, body in STANDINS.items():
        (bindir / name).write_text(body)
        (bindir / name).chmod(0o755)
    work = tmp / "cwd"
    work.mkdir(exist_ok=True)
    env = ["env", "-i", f"PATH={bindir}:/usr/bin:/bin", "bash", "-c"]
    return run_ok([*env, f'cd "{work}"\n{script}'], timeout=30).stdout


def grub_line(root: Path, tmp: Path, dropins: bool = True) -> list[str]:
    """GRUB_CMDLINE_LINUX then _DEFAULT as grub-mkconfig ends with them: Debian's (it
    sources grub.d/*.cfg after /etc/default/grub) or upstream's (``dropins=False``). Its
    ``sysconfdir`` is set, as grub-mkconfig sets it, for a file that uses it (a loop of its
    own over grub.d)."""
    loop = f'for f in "{root}"/etc/default/grub.d/*.cfg; do [ -e "$f" ] && . "$f"; done\n'
    script = (
        f'sysconfdir="{root}/etc"\n'
        f'. "{root}/etc/default/grub"\n'
        + (loop if dropins else "")
        + 'printf "%s %s" "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT"\n'
    )
    return _bash(script, tmp).split()


def mkinitcpio_modules(root: Path, tmp: Path) -> list[str]:
    parts = [root / "etc/mkinitcpio.conf", *sorted((root / "etc/mkinitcpio.conf.d").glob("*.conf"))]
    combined = tmp / "mkinitcpio.combined"
    combined.write_bytes(b"".join(p.read_bytes() for p in parts))
    script = (
        f'. "{combined}"\nset -f\n'
        "[[ ${MODULES@a} != *a* ]] && MODULES=($MODULES)\n"  # mkinitcpio's arrayize_config
        'printf "%s\\n" "${MODULES[@]}"\n'
    )
    return _bash(script, tmp).split()


def cmdline_args(root: Path) -> list[str]:
    text = (root / "etc/kernel/cmdline").read_text()
    return [
        w for line in text.split("\n") if not line.strip().startswith("#") for w in line.split()
    ]


def dracut_drivers(root: Path, tmp: Path) -> list[str]:
    script = (
        f'for f in "{root}"/etc/dracut.conf.d/*.conf; do . "$f"; done\n'
        'printf "%s" "$force_drivers"\n'
    )
    return _bash(script, tmp).split()


def modprobe_ids(root: Path) -> list[str]:
    out = run_ok(["modprobe", "-c", "-C", str(root / "etc/modprobe.d")]).stdout
    ids: list[str] = []
    for line in out.splitlines():
        m = re.match(r"options vfio_pci (?:.* )?ids=(\S+)", line)
        if m:
            ids = m[1].split(",")  # the module keeps the last value
    return ids


def proxmox_first_line(root: Path) -> list[str]:
    """What proxmox-boot-tool puts on each ESP entry's ``options``: the first line of
    /etc/kernel/cmdline as it is (its ``get_first_line``: no comment handling, the rest of
    the file unread)."""
    data = (root / "etc/kernel/cmdline").read_text()
    return data.split("\n", 1)[0].split()


def grubenv(root: Path) -> dict[str, str]:
    """/boot/grub2/grubenv's variables (``name=value`` lines; ``#`` lines and the padding
    are none)."""
    path = root / "boot/grub2/grubenv"
    text = path.read_text() if path.exists() else ""
    pairs = [ln.partition("=") for ln in text.split("\n") if ln and not ln.startswith("#")]
    return {k: v for k, _eq, v in pairs}


def bls_options(root: Path, entry: Path) -> list[str]:
    """A BLS entry's command line as GRUB's blscfg makes it: every ``options`` line joined,
    ``$name``/``${name}`` taken from grubenv (unset: empty)."""
    env = grubenv(root)
    words: list[str] = []
    for line in entry.read_text().split("\n"):
        if re.match(r"options(\s|$)", line):
            line = re.sub(
                r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m[1], ""), line[7:]
            )
            words += line.split()
    return words


def kernelstub_options(root: Path) -> list[str]:
    """The options kernelstub writes into its entries: ``user.kernel_options`` (``default``'s
    where there is no ``user``), a string split at blanks as its config.py does."""
    data = json.loads((root / "etc/kernelstub/configuration").read_text())
    opts = data.get("user", data.get("default", {}))["kernel_options"]
    return opts.split() if isinstance(opts, str) else [str(o) for o in opts]
