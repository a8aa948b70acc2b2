# SPDX-License-Identifier: Apache-2.0
"""Validating domain XML — ours or anyone's — in layers, as a CI gate.

1. ``file``: readable, well-formed, a ``<domain>``;
2. ``schema``: libvirt's RelaxNG (the local libvirt's or ``--schema-dir``), loaded once per
   process, each fault placed on the element the schema rejects;
3. ``policy``: generic guest-PCI rules for every domain, GPU rules only for GPU functions;
4. ``host``: with host facts, the hostdevs exist, whole cards, MMIO windows;
5. ``libvirt``: optionally a define of a private copy on a connection.

The catalogue of codes is in :mod:`.rules`; reports in :mod:`.reports`. Start-up matters
(CI hooks call it per file), so heavy modules are imported only where used.
"""

from __future__ import annotations

from .rules import DomainFinding, Selection, make
from .schema import DomainSchema, faults, load

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from passthrough.model import Host

__all__ = [
    "DomainFinding",
    "DomainSchema",
    "Options",
    "Selection",
    "load",
    "validate_file",
    "validate_files",
    "validate_text",
]


class Options:
    __slots__ = ("host", "libvirt_uri", "schema", "schema_only")

    def __init__(
        self,
        host: Host | None = None,
        schema: DomainSchema | None = None,
        schema_only: bool = False,
        libvirt_uri: str | None = None,
    ) -> None:
        self.host = host
        self.schema = schema
        self.schema_only = schema_only
        self.libvirt_uri = libvirt_uri


def _parse(text: bytes, name: str) -> tuple[Any, list[DomainFinding]]:
    from lxml import etree

    from passthrough.vm.xmlfield import sourceline

    try:
        doc = etree.fromstring(text, etree.XMLParser(resolve_entities=False, no_network=True))
    except etree.XMLSyntaxError as exc:
        line = exc.lineno or 0
        return None, [make("xml-malformed", f"not well-formed XML: {exc.msg}", name, "/", line)]
    if doc.tag != "domain":
        return None, [
            make(
                "xml-not-domain",
                f"not a libvirt domain (the root element is <{doc.tag}>, not <domain>)",
                name,
                doc.getroottree().getpath(doc),
                sourceline(doc),
            )
        ]
    return doc, []


def validate_text(
    text: bytes, name: str, host: Host | None = None, use_schema: bool = True
) -> list[DomainFinding]:
    """Every finding for one document (no selection applied): the library entry point."""
    return check(text, name, Options(host=host, schema=load(None) if use_schema else None))


def check(text: bytes, name: str, opts: Options) -> list[DomainFinding]:
    doc, out = _parse(text, name)
    if doc is None:
        return out
    if opts.schema is not None:
        out.extend(_schema_findings(doc, name, opts.schema))
    if opts.schema_only:
        return out
    from .domain import check as policy

    out.extend(policy(doc, name, opts.host))
    if opts.libvirt_uri and not any(f.layer in ("file", "schema") for f in out):
        from .define_check import libvirt_check

        out.extend(libvirt_check(doc, name, opts.libvirt_uri))
    return out


IOMMUFD_DRIVERS = "devices/hostdev/driver[@iommufd] | devices/interface/driver[@iommufd]"
_COMPILED: list[Any] = []  # the XPath above, compiled on first use (a batch asks per file)


def _is_fifo(path: str, exc: Exception) -> bool:
    import os
    import stat

    from passthrough.inputs import NOT_REGULAR

    try:
        return str(exc) == NOT_REGULAR and stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


def _iommufd_drivers(doc: Any) -> list[Any]:
    if not _COMPILED:
        from lxml import etree

        _COMPILED.append(etree.XPath(IOMMUFD_DRIVERS))
    found: list[Any] = _COMPILED[0](doc)
    return found


def _schema_findings(doc: Any, name: str, schema: DomainSchema) -> list[DomainFinding]:
    """The schema's faults; where the schema predates ``<driver iommufd>`` (libvirt 12.1)
    the rest of the domain is checked without the attribute and each use of it is named,
    so an old schema neither blames the whole ``<devices>`` nor passes the attribute
    unseen (the policy layer checks its value)."""
    import copy

    from passthrough.vm.xmlfield import sourceline

    out: list[DomainFinding] = []
    work = doc
    drivers = _iommufd_drivers(doc)
    if drivers and not schema.knows_iommufd:
        work = copy.deepcopy(doc)
        for el in _iommufd_drivers(work):
            del el.attrib["iommufd"]
        for el in drivers:
            out.append(
                make(
                    "schema-iommufd",
                    f"libvirt {schema.version}'s schema predates <driver iommufd> (libvirt "
                    "12.1): the rest of the domain is checked against it; pass --schema-dir "
                    "of libvirt 12.1 or newer to check the attribute too",
                    name,
                    doc.getroottree().getpath(el),
                    sourceline(el),
                )
            )
    tree = work.getroottree()
    for fault in faults(schema.rng(), work):
        el = fault.element
        out.append(make("schema", fault.message, name, tree.getpath(el), sourceline(el)))
    return out


def validate_file(path: str, opts: Options) -> list[DomainFinding]:
    """One file of a batch: a missing or unreadable file is a finding, never an abort; so is
    a FIFO or a device (never waited on) and a file larger than virsh reads."""
    from passthrough.inputs import MAX_DOMAIN, Unreadable, read_bytes

    what = "a domain virsh would read"
    try:
        if path == "-":  # standard input (virsh dumpxml NAME | passthrough validate -)
            import sys

            data = sys.stdin.buffer.read(MAX_DOMAIN + 1)
            if len(data) > MAX_DOMAIN:
                raise Unreadable(f"larger than {MAX_DOMAIN >> 20} MiB: not {what}")
        else:
            data = read_bytes(path, what, MAX_DOMAIN)
    except Unreadable as exc:
        hint = " (a pipe: give - to read standard input)" if _is_fifo(path, exc) else ""
        return [make("file-unreadable", f"cannot read it: {exc}{hint}", path, "/", 0)]
    except OSError as exc:
        return [make("file-unreadable", f"cannot read it: {exc.strerror or exc}", path, "/", 0)]
    return check(data, path, opts)


# a batch shares its files among forked workers from this many files per worker on (below
# it a fork costs more than it saves), at most this many workers
PER_WORKER = 64
MAX_WORKERS = 8


def _workers(files: int, opts: Options) -> int:
    """How many processes validate a batch: one per CPU this process may run on, each with
    at least PER_WORKER files; one where a libvirt connection is asked for (a connection
    does not survive a fork) or the platform has no fork."""
    import os

    if opts.libvirt_uri or not hasattr(os, "fork"):
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_WORKERS, files // PER_WORKER))


def validate_files(
    files: list[str], opts: Options, keep: Callable[[list[DomainFinding]], list[DomainFinding]]
) -> dict[str, list[DomainFinding]]:
    """Each file's findings (``keep`` applied), in the files' order. A large batch on a
    machine with more than one CPU is shared among forked workers, which inherit the compiled
    schema; this process takes the first share and reads each worker's findings back
    through a pipe. A worker that fails is not trusted: its files are validated here."""
    from passthrough.records import paused_gc

    with paused_gc():
        return _validate_files(files, opts, keep)


def _validate_files(
    files: list[str], opts: Options, keep: Callable[[list[DomainFinding]], list[DomainFinding]]
) -> dict[str, list[DomainFinding]]:
    workers = _workers(len(files), opts)
    if workers < 2:
        return {name: keep(validate_file(name, opts)) for name in files}
    import os
    import pickle
    import sys

    if not opts.schema_only:
        from . import domain  # noqa: F401  (imported once here, not once per worker)
    size = -(-len(files) // workers)
    shares = [files[i : i + size] for i in range(0, len(files), size)]
    sys.stdout.flush()
    sys.stderr.flush()
    children: list[tuple[int, int, list[str]]] = []
    for share in shares[1:]:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker: its share, pickled into the pipe, and out without cleanup
            code = 1
            try:
                os.close(read)
                data = pickle.dumps([(n, keep(validate_file(n, opts))) for n in share])
                with os.fdopen(write, "wb") as fh:
                    fh.write(data)
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        children.append((pid, read, share))
    found = {name: keep(validate_file(name, opts)) for name in shares[0]}
    for pid, read, share in children:
        with os.fdopen(read, "rb") as fh:
            data = fh.read()
        _, status = os.waitpid(pid, 0)
        try:
            got = pickle.loads(data) if status == 0 else None
        except Exception:  # a torn pipe: the worker's result is not trusted
            got = None
        if got is None:
            got = [(n, keep(validate_file(n, opts))) for n in share]
        found.update(got)
    return {name: found[name] for name in files}
