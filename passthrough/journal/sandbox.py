# SPDX-License-Identifier: Apache-2.0
"""The sandbox a root's own tools run in (``apply --root TREE`` as root).

Run as a script, by the reading machine's own Python, as PID 1 of new user, mount and PID
namespaces (``unshare``, see ``chroot_argv`` below)::

    python3 -I -S sandbox.py plain|grub TREE -- ARGV...

It builds the tree's view of the world with the reading machine's own code only, then
chroots into the tree and gives up CAP_SYS_CHROOT before running the tree's command (a
chroot can be left by its own root with a second chroot; without that capability it
cannot). What the command gets:

- a ``/proc`` of its own PID namespace (every ``/proc/N/root`` is the tree);
- a ``/dev`` that is a small read-only tmpfs holding null, zero, full, random, urandom
  and tty bound from the host — and, for ``grub`` only, the node of the block device
  that holds the tree (grub-probe finds "/" by it; a user namespace cannot open a block
  device, for reading or writing);
- an empty read-only tmpfs as ``/sys`` (neither update-initramfs nor update-grub needs
  one in a tree: tried with the real tools);
- a user namespace mapping root to root (files it writes are owned by root, as they
  would be), in which its root holds no capability over the host: no device node can be
  made, no host filesystem mounted, no module loaded, no host sysfs file written.

Exit 125 when the sandbox cannot be built (the command did not run), 127 when the tree
has no such command.
"""

from __future__ import annotations

import ctypes
import functools
import os
import subprocess
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_CAPBSET_DROP, CAP_SYS_CHROOT = 24, 18
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
KINDS = ("plain", "grub")
SEARCH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_libc = ctypes.CDLL(None, use_errno=True)


class SandboxError(Exception):
    pass


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"{what}: {os.strerror(err)}")


def _mount(src: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    _check(
        _libc.mount(
            src.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def _tree_device(tree: str) -> str | None:
    """The block device holding the tree's filesystem (as /proc/self/mountinfo names it)."""
    dev = os.stat(tree).st_dev
    want = f"{os.major(dev)}:{os.minor(dev)}"
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if fields[2] == want and len(rest) > 1 and rest[1].startswith("/dev/"):
                return rest[1]
    return None


def build(profile: str, tree: str) -> None:
    """Mount the tree's world (as PID 1 of the new namespaces) and make the tree ``/``."""
    _mount("none", "/", None, MS_REC | MS_PRIVATE, None)
    os.chdir(tree)
    for sub in ("proc", "dev", "sys"):
        if not os.path.isdir(sub) or os.path.islink(sub):
            raise SandboxError(f"{sub}: not a directory in the tree")
    _mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    _mount("tmpfs", "dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=64k")
    for name in DEV_NODES:
        open(f"dev/{name}", "w").close()
        _mount(f"/dev/{name}", f"dev/{name}", None, MS_BIND, None)
    for name, to in (("fd", "/proc/self/fd"), ("stdin", "fd/0"), ("stdout", "fd/1")):
        os.symlink(to, f"dev/{name}")
    os.symlink("fd/2", "dev/stderr")
    os.mkdir("dev/pts")
    os.mkdir("dev/shm")
    _mount("tmpfs", "sys", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k")
    if profile == "grub" and (device := _tree_device(tree)):
        path = "dev" + device[len("/dev") :]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").close()
        _mount(device, path, None, MS_BIND, None)
    _mount("none", "dev", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC, None)
    os.chroot(".")
    os.chdir("/")
    # without CAP_SYS_CHROOT nothing it runs can chroot again (the way out of a chroot),
    # nor enter another mount namespace; a set-user-ID program cannot get it back
    _check(_libc.prctl(PR_CAPBSET_DROP, CAP_SYS_CHROOT, 0, 0, 0), "drop CAP_SYS_CHROOT")


# A root's own tools run in new user, mount and PID namespaces, chrooted into the tree with
# a /proc of their own, a /dev of six character devices, an empty read-only /sys and no
# CAP_SYS_CHROOT (journal/sandbox.py says what each part stops). The profile per command:
# "plain", "grub" (grub-probe also needs the node of the block device holding the tree to
# find "/", which a user namespace cannot open), or absent: listed for the admin, never run
# (docs/safety.md, "what runs where"). Imported by apply; run as a script, see main().
SANDBOX = os.path.abspath(__file__)
PROFILES: dict[str, str] = {
    "update-initramfs": "plain",
    "dracut": "plain",
    "mkinitcpio": "plain",
    "kernel-install": "plain",
    "grubby": "plain",
    "kernelstub": "plain",
    "update-grub": "grub",
    "grub-mkconfig": "grub",
    "grub2-mkconfig": "grub",
    "lsinitramfs": "plain",
    "lsinitrd": "plain",
    "lsinitcpio": "plain",
}
UNSHARE = ("unshare", "--user", "--map-root-user", "--mount", "--pid", "--fork")


def sandbox_profile(argv: tuple[str, ...]) -> str | None:
    """How a command runs inside a tree; None: it cannot run there (proxmox-boot-tool
    mounts the ESPs by UUID, rpm-ostree needs its daemon): it is listed."""
    return PROFILES.get(os.path.basename(argv[0])) if argv else None


@functools.cache
def sandbox_works() -> bool:
    """Whether this kernel lets us make the namespaces (a container may forbid them)."""
    try:
        r = subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def chroot_argv(root_path: str, argv: tuple[str, ...], profile: str | None = None) -> list[str]:
    """The sandboxed command line (a command without a profile of its own gets the one
    given, else the plain one: the tests' own helpers, apt-get and dpkg, run this way)."""
    profile = sandbox_profile(argv) or profile or "plain"
    python = sys.executable or "python3"
    return [*UNSHARE, python, "-I", "-S", SANDBOX, profile, root_path, "--", *argv]


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] not in KINDS or argv[2] != "--" or not argv[3:]:
        print("usage: sandbox.py plain|grub TREE -- ARGV...", file=sys.stderr)
        return 125
    profile, tree, rest = argv[0], argv[1], argv[3:]
    try:
        build(profile, tree)
    except (SandboxError, OSError) as exc:
        print(f"sandbox: {exc}", file=sys.stderr)
        return 125
    env = {"PATH": SEARCH, "LANG": "C.UTF-8", "HOME": "/root"}
    # looked up here rather than by os.execvpe, which imports modules the tree lacks
    found = [rest[0]] if "/" in rest[0] else [f"{d}/{rest[0]}" for d in SEARCH.split(":")]
    for path in found:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            try:
                os.execve(path, rest, env)
            except OSError as exc:
                print(f"{rest[0]}: {exc.strerror}", file=sys.stderr)
                return 126
    print(f"{rest[0]}: not found in the tree", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
