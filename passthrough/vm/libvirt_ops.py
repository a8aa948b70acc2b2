# SPDX-License-Identifier: Apache-2.0
"""libvirt-python: define, start, stop, undefine and inspect guests.

Errors become one-line PassthroughErrors naming the URI or domain; libvirt's own error
handler is silenced so it does not print to stderr behind our back.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from passthrough.errors import EXIT_BACKEND, EXIT_USAGE, PassthroughError, echo, echo_path, quote
from passthrough.vm.disk import ExistingDisk
from passthrough.vm.disk import prepare as disk_prepare
from passthrough.vm.vgpustop import GRACE, local_driver, qemu_pid, stop_gently, vgpu_hostdevs

# how `vm define` says what to do with a disk already there (the VM module says its own)
CLI_CHOOSE = "--reuse-disk keeps it as it is, --overwrite-disk replaces it"

STATES = {
    0: "no state",
    1: "running",
    2: "blocked",
    3: "paused",
    4: "shutting down",
    5: "shut off",
    6: "crashed",
    7: "suspended",
}


class LibvirtError(PassthroughError):
    """libvirt failed underneath (cannot connect, define or start refused by libvirt)."""

    exit_code = EXIT_BACKEND


class DomainRefused(LibvirtError):
    """The named domain is missing, or already there: a refusal, nothing changed."""

    exit_code = EXIT_USAGE


# what `vm` and `validate --connect` say where the binding is not installed: it is an extra
# (pyproject.toml), a C build against libvirt's headers, which the host commands never need
MISSING = (
    "libvirt-python is not installed: pip install 'passthrough[libvirt]' "
    '(it builds against libvirt\'s headers: README, "Install")'
)


def binding() -> Any:
    """The libvirt module, its error handler silenced; one line where it cannot be imported:
    how to install it where it is missing, what broke where it is there but broken."""
    try:
        import libvirt
    except ImportError as exc:
        if exc.name == "libvirt":
            raise LibvirtError(MISSING) from None
        raise LibvirtError(f"libvirt-python cannot be imported ({exc})") from None
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    return libvirt


def connect(uri: str) -> Any:
    libvirt = binding()
    try:
        return libvirt.open(uri)
    except libvirt.libvirtError as exc:
        raise LibvirtError(f"cannot connect to {uri}: {exc.get_error_message()}") from None


def _lookup(conn: Any, name: str) -> Any:
    libvirt = binding()
    try:
        return conn.lookupByName(name)
    except libvirt.libvirtError:
        raise DomainRefused(f"no domain {quote(name)} on {conn.getURI()}") from None


def define(
    uri: str,
    xml: str,
    name: str,
    overlay: tuple[str, str] | None = None,
    start_it: bool = False,
    existing: ExistingDisk = ExistingDisk.REFUSE,
    choose: str = CLI_CHOOSE,
) -> dict[str, Any]:
    """Define ``xml`` (and start it, on the same connection: the test driver keeps its
    state per connection); refuses a name that already exists. ``overlay`` = (base, path)
    makes a qcow2 overlay on the base image (a disk already at ``path`` is handled as
    ``existing`` says; see :mod:`passthrough.vm.disk`). Returns the domain's status, with
    ``disk`` saying what was done at the overlay's path."""
    libvirt = binding()
    conn = connect(uri)
    try:
        try:
            conn.lookupByName(name)
            raise DomainRefused(
                f"domain {quote(name)} is already defined on {uri}; undefine it first or pick another name"
            )
        except libvirt.libvirtError:
            pass
        disk = disk_prepare(*overlay, existing, choose) if overlay is not None else None
        try:
            try:
                dom = conn.defineXML(xml)
            except libvirt.libvirtError as exc:
                raise LibvirtError(f"{uri} refused the domain: {exc.get_error_message()}") from None
            if disk is not None:
                disk.place()
        finally:
            if disk is not None:
                disk.discard()  # nothing once placed; a refused domain leaves no new image
        if start_it:
            try:
                dom.create()
            except libvirt.libvirtError as exc:
                raise LibvirtError(
                    f"{name} was defined but did not start: {exc.get_error_message()}"
                ) from None
        result = _status(dom, uri)
        if disk is not None:
            result["disk"] = disk.to_json()
        return result
    finally:
        conn.close()


def define_file(
    uri: str,
    path: str,
    base_image: str | None = None,
    start_it: bool = False,
    existing: ExistingDisk = ExistingDisk.REFUSE,
) -> dict[str, Any]:
    """Define the domain XML in ``path``; with ``base_image``, first make the qcow2 overlay
    its first disk points at on that image."""
    from lxml import etree

    from passthrough.inputs import MAX_DOMAIN, Unreadable, read_bytes

    try:
        data = read_bytes(path, "a domain virsh would read", MAX_DOMAIN)
        doc = etree.fromstring(data, etree.XMLParser(resolve_entities=False, no_network=True))
    except Unreadable as exc:
        raise PassthroughError(f"{echo_path(path)}: {exc}") from None
    except etree.XMLSyntaxError as exc:
        raise PassthroughError(f"{echo_path(path)}: not well-formed XML ({exc})") from None
    if doc.tag != "domain":  # bad input, not libvirt failing: refused before connecting
        raise PassthroughError(
            f"{echo_path(path)}: not a libvirt domain (the root element is <{echo(str(doc.tag))}>)"
        )
    overlay = None
    if base_image:
        disk = doc.find("devices/disk[@device='disk']/source")
        if disk is None or not disk.get("file"):
            raise PassthroughError(f"{path}: no disk source for the overlay")
        if not os.path.exists(base_image):
            raise PassthroughError(f"--base-image {base_image}: does not exist")
        overlay = (base_image, str(disk.get("file")))
    if not urlsplit(uri).netloc:  # a remote daemon's files are not this machine's to check
        _refuse_missing_disks(doc, path, overlay[1] if overlay else None)
    name = doc.findtext("name") or ""
    result = define(uri, data.decode(), name, overlay, start_it=start_it, existing=existing)
    if (
        not doc.findall("devices/disk[@device='disk']")
        and doc.find("os/boot[@dev='network']") is None
    ):
        result["warnings"] = [
            f"{echo_path(path)}: nothing to boot: no disk and no network boot "
            "(the guest starts into the firmware's shell)"
        ]
    return result


def _refuse_missing_disks(doc: Any, path: str, made: str | None) -> None:
    """Every file a disk of the domain reads exists, or is the overlay this define makes:
    libvirt defines a domain over a missing file and only its start fails."""
    for source in doc.findall("devices/disk/source[@file]"):
        disk = str(source.get("file"))
        if disk != made and not os.path.exists(disk):
            raise PassthroughError(
                f"{echo_path(path)}: disk {echo_path(disk)} does not exist (make it, or give "
                "--base-image IMAGE to make the overlay a domain rendered with one points at)"
            )


def start(uri: str, name: str) -> None:
    libvirt = binding()
    conn = connect(uri)
    try:
        dom = _lookup(conn, name)
        if dom.isActive():
            return
        try:
            dom.create()
        except libvirt.libvirtError as exc:
            raise LibvirtError(f"{name} did not start: {exc.get_error_message()}") from None
    finally:
        conn.close()


def stop(uri: str, name: str, force: bool = False, grace: float = GRACE) -> str | None:
    """A clean shutdown (``force``: destroy); a guest holding a vGPU is never destroyed
    with SIGKILL (:mod:`passthrough.vm.vgpustop`): the one line saying what happened to it."""
    libvirt = binding()
    conn = connect(uri)
    try:
        dom = _lookup(conn, name)
        if not dom.isActive():
            return None
        remote = bool(urlsplit(uri).netloc)
        held = vgpu_hostdevs(str(dom.XMLDesc(0)), (lambda _a: None) if remote else local_driver)
        if held:
            system = uri.rstrip("/") == "qemu:///system"
            pid = qemu_pid(name) if system else None
            return stop_gently(dom, libvirt, grace, force, held, pid)
        try:
            dom.destroy() if force else dom.shutdown()
        except libvirt.libvirtError as exc:
            raise LibvirtError(f"{name} did not stop: {exc.get_error_message()}") from None
        return None
    finally:
        conn.close()


def undefine(uri: str, name: str) -> None:
    libvirt = binding()
    conn = connect(uri)
    try:
        dom = _lookup(conn, name)
        if dom.isActive():
            raise LibvirtError(f"{name} is running; stop it first")
        flags = getattr(libvirt, "VIR_DOMAIN_UNDEFINE_NVRAM", 4)
        try:
            dom.undefineFlags(flags)
        except libvirt.libvirtError:
            dom.undefine()  # drivers without NVRAM support (the test driver)
    finally:
        conn.close()


def status(uri: str, name: str) -> dict[str, Any]:
    conn = connect(uri)
    try:
        return _status(_lookup(conn, name), uri)
    finally:
        conn.close()


def _status(dom: Any, uri: str) -> dict[str, Any]:
    from passthrough.vm.domxml import Domain

    state, _reason = dom.state()
    hostdevs = []
    for h in Domain.parse(str(dom.XMLDesc(0))).pci_hostdevs:
        host, guest = h.source, h.address
        if host is None:
            continue
        # the guest side without its PCI domain (always 0 in a guest): 01:00.0
        hostdevs.append({"host": str(host), "guest": str(guest)[5:] if guest else None})
    return {
        "name": dom.name(),
        "uri": uri,
        "uuid": dom.UUIDString(),
        "state": STATES.get(state, str(state)),
        "active": bool(dom.isActive()),
        "hostdevs": hostdevs,
    }
