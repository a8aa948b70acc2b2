# SPDX-License-Identifier: Apache-2.0
"""Throwaway SSH hosts for the fleet benchmark: one network namespace per host, each with
its own address on a bridge and its own ``sshd`` listening there, so Ansible reaches every
host over a real SSH connection (a TCP handshake, key exchange and a login per
connection, ControlPersist as Ansible sets it) rather than through ``local``.

The hosts share this machine's file system: each one's ``passthrough_root`` is its own
sample root, as with the local connection. Needs root, ``ip`` (iproute2) and
``/usr/sbin/sshd`` (Debian: ``apt-get install openssh-server``); everything is removed
again on the way out (namespaces, links, daemons, keys).

Not a test and not part of the package: imported by bench_fleet.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

SSHD = "/usr/sbin/sshd"
PREFIX = "ptb"  # the benchmark's names: namespaces ptb0.., links vptb0.., the bridge ptbbr0
NET = "10.231"  # a /16 no one routes: 10.231.0.1 is this machine, hosts from 10.231.1.2


def missing() -> str | None:
    """Why the SSH hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "the SSH hosts need root (network namespaces, a bridge)"
    if not os.path.exists(SSHD):
        return f"no {SSHD}: apt-get install openssh-server"
    if shutil.which("ip") is None:
        return "no ip command: apt-get install iproute2"
    return None


def _ip(*argv: str, ns: str | None = None) -> None:
    cmd = ["ip", "netns", "exec", ns, "ip", *argv] if ns else ["ip", *argv]
    subprocess.run(cmd, check=True, capture_output=True)


def address(i: int, net: str = NET) -> str:
    return f"{net}.{1 + i // 250}.{2 + i % 250}"


def _wait_port(host: str, seconds: float = 20.0) -> None:
    end = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection((host, 22), timeout=1):
                return
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


@contextlib.contextmanager
def hosts(count: int, work: Path, prefix: str = PREFIX, net: str = NET) -> Iterator[dict[str, str]]:
    """``count`` SSH hosts; yields the client's settings (key, user, options) for an
    inventory, with each host at :func:`address` ``(i, net)``. ``prefix`` names the
    namespaces, links and bridge and ``net`` is the /16 they sit on, so that two users of this
    machine (a test and the benchmark) each have their own."""
    bridge = f"{prefix}br0"
    work.mkdir(parents=True, exist_ok=True)
    # sshd's privilege separation directory (made by its service unit, which is not run here)
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    key, host_key = work / "client", work / "host_key"
    for path in (key, host_key):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
            check=True,
            capture_output=True,
        )
    (work / "authorized_keys").write_text(Path(f"{key}.pub").read_text())
    names = [f"{prefix}{i}" for i in range(count)]
    made_bridge = False
    try:
        _ip("link", "add", bridge, "type", "bridge")
        made_bridge = True
        _ip("addr", "add", f"{net}.0.1/16", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, ns in enumerate(names):
            subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
            _ip("link", "add", f"v{ns}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", f"v{ns}", "master", bridge)
            _ip("link", "set", f"v{ns}", "up")
            _ip("addr", "add", f"{address(i, net)}/16", "dev", "eth0", ns=ns)
            _ip("link", "set", "eth0", "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)
            config = work / f"sshd-{i}.conf"
            config.write_text(
                f"ListenAddress {address(i, net)}\n"
                f"HostKey {host_key}\n"
                f"PidFile {work}/sshd-{i}.pid\n"
                f"AuthorizedKeysFile {work}/authorized_keys\n"
                "PermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\n"
                "UsePAM no\n"
                "StrictModes no\n"
                "MaxStartups 100:30:200\n"
                "Subsystem sftp internal-sftp\n"
            )
            subprocess.run(
                ["ip", "netns", "exec", ns, SSHD, "-f", str(config)],
                check=True,
                capture_output=True,
            )
            _pid(work, i)  # written once the daemon listens
        for i in range(count):
            _wait_port(address(i, net))
        yield {
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(key),
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
            " -o LogLevel=ERROR",
        }
    finally:
        for i in range(count):
            pid = _pid(work, i, tries=1)
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        for ns in names:  # and each session sshd forked for a login (ControlPersist keeps them)
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in pids.stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGTERM)
        for ns in names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
            subprocess.run(["ip", "link", "del", f"v{ns}"], capture_output=True, check=False)
        if made_bridge:
            subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)


def _pid(work: Path, i: int, tries: int = 100) -> int:
    for _ in range(tries):
        try:
            return int((work / f"sshd-{i}.pid").read_text())
        except (OSError, ValueError):
            time.sleep(0.02)
    return 0
