# SPDX-License-Identifier: Apache-2.0
"""libvirt's RelaxNG domain schema: which libvirt's, loaded once, and errors that point at
the element at fault.

libxml2 reports an interleave failure against the parent (``/domain: Extra element devices
in interleave``, line 0). We find the element itself: on a copy, take one child away at a
time; a child whose removal removes errors holds the fault, so descend into it. The element
where no child helps is the one the schema rejects.
"""

from __future__ import annotations

import os
import re

from passthrough.errors import PassthroughError
from passthrough.inputs import read_head

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

DEFAULT_SCHEMA_DIR = "/usr/share/libvirt/schemas"
MAX_FAULTS = 3  # per file: enough to act on, bounded work on a very broken file


class SchemaNotFound(PassthroughError):
    pass


class DomainSchema:
    """One libvirt's ``schemas/`` directory; the RelaxNG is compiled on first use."""

    __slots__ = ("_iommufd", "_rng", "directory", "version")

    def __init__(self, directory: str, version: str) -> None:
        self.directory = directory
        self.version = version  # "9.0.0-4+deb12u2", or "unknown version"
        self._rng: Any = None
        self._iommufd: bool | None = None

    @property
    def knows_iommufd(self) -> bool:
        """Whether these schemas define the hostdev ``<driver iommufd>`` attribute (libvirt
        12.1+); Debian 12's 9.0 does not, and rejects the whole ``<devices>`` for it."""
        if self._iommufd is None:
            self._iommufd = False
            for name in sorted(os.listdir(self.directory))[:MAX_SCHEMA_FILES]:
                if name.endswith(".rng") and b'name="iommufd"' in (
                    read_head(os.path.join(self.directory, name), MAX_SCHEMA_BYTES) or b""
                ):
                    self._iommufd = True
                    break
        return self._iommufd

    @property
    def label(self) -> str:
        return f"libvirt {self.version} schemas ({self.directory})"

    def rng(self) -> Any:
        if self._rng is None:
            from lxml import etree

            path = os.path.join(self.directory, "domain.rng")
            if not os.path.isfile(path):
                raise SchemaNotFound(
                    f"no domain.rng in {self.directory} (libvirt's schemas/ directory is needed; "
                    "install libvirt-clients or pass --schema-dir)"
                )
            try:
                self._rng = etree.RelaxNG(etree.parse(path))
            except (etree.RelaxNGParseError, etree.XMLSyntaxError) as exc:
                raise SchemaNotFound(f"{path} is not a usable RelaxNG schema: {exc}") from None
        return self._rng


# libvirt ships about 30 schema files, the largest (domaincommon.rng) under 300 KB
MAX_SCHEMA_FILES = 200
MAX_SCHEMA_BYTES = 4 << 20

_LOADED: dict[str, DomainSchema] = {}  # a library caller validating many texts compiles once


def load(directory: str | None) -> DomainSchema:
    d = os.path.normpath(directory or DEFAULT_SCHEMA_DIR)
    if d not in _LOADED:
        _LOADED[d] = DomainSchema(d, schema_version(d))
    return _LOADED[d]


# Debian/Ubuntu packages that have shipped /usr/share/libvirt/schemas (libvirt0 on Debian
# 12; libvirt-common on some releases), or sit beside them with the same version
DEB_PACKAGES = ("libvirt0", "libvirt-common", "libvirt-clients", "libvirt-daemon")
_VERSION_IN_PATH = re.compile(r"libvirt[-_](?:[a-z]+[-_])*(\d+\.\d+\.\d+)")
_CHANGELOG_HEAD = re.compile(rb"^libvirt \(([^)]+)\)")


def _changelog_version(path: str) -> str | None:
    import zlib  # built in; gzip would pull in more than one line needs

    try:
        head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(read_head(path, 4096) or b"", 256)
    except zlib.error:
        return None
    m = _CHANGELOG_HEAD.match(head)
    return m[1].decode("ascii", "replace") if m else None


def schema_version(directory: str) -> str:
    """Which libvirt the schemas come from, from what an unpacked package leaves around them:
    a VERSION file we ask users to write, a Debian changelog beside them (usr/share/doc), or
    a version in the path (``libvirt-libs-9.0.0-…``)."""
    marker = os.path.join(directory, "VERSION")
    if os.path.isfile(marker):
        said = read_head(marker, 64) or b""
        return said.decode("utf-8", "replace").strip() or "unknown version"
    # DIR is <prefix>/share/libvirt/schemas: docs are in <prefix>/share/doc/<package>/ (the
    # packages that ship the schemas, by name: listing /usr/share/doc costs more than this)
    doc = os.path.join(os.path.dirname(os.path.dirname(directory)), "doc")
    for package in DEB_PACKAGES:
        version = _changelog_version(os.path.join(doc, package, "changelog.Debian.gz"))
        if version:
            return version
    m = _VERSION_IN_PATH.search(os.path.realpath(directory))
    return m[1] if m else "unknown version"


class SchemaFault:
    __slots__ = ("element", "message")

    def __init__(self, element: Any, message: str) -> None:
        self.element = element  # in the caller's document
        self.message = message


Errors = frozenset[tuple[str, str]]  # (path, message) as libxml2 reports them
Ordered = tuple[tuple[str, str], ...]  # the same, in libxml2's order


def _errors_of(rng: Any) -> Ordered:
    return tuple((e.path or "", e.message or "") for e in rng.error_log)


def _children(el: Any) -> list[Any]:
    # last child first: of two duplicates, the later one is the extra
    return list(reversed([c for c in el if isinstance(c.tag, str)]))


class _Work:
    """The copy of the document the search takes apart, and every validation of it made
    since it last changed: a validation of 10,000 <hostdev> costs a third of a second, and
    the search asks the same question more than once (the document as it is, for the
    message; the document without the element found, which is the next round's start)."""

    def __init__(self, rng: Any, doc: Any, first: Ordered) -> None:
        self.rng = rng
        self.doc = doc
        self.ordered = first  # the errors of the document as it is now
        self.base: Errors = frozenset(first)
        # (parent, removed children) → errors; holds the elements so their ids stay theirs
        self._memo: dict[tuple[int, tuple[int, ...]], tuple[Any, list[Any], Ordered]] = {}

    def _validate(self) -> Ordered:
        return () if self.rng.validate(self.doc) else _errors_of(self.rng)

    def without(self, el: Any, group: list[Any]) -> Errors:
        """The errors with ``group`` (children of ``el``) taken away; then put back as
        they were."""
        key = (id(el), tuple(id(c) for c in group))
        if key not in self._memo:
            kids = list(el)
            for child in group:
                el.remove(child)
            try:
                found = self._validate()
            finally:
                el[:] = kids  # one pass: inserting each back at its index costs n per child
            self._memo[key] = (el, group, found)
        return frozenset(self._memo[key][2])

    def remove(self, el: Any) -> Errors:
        """Take ``el`` out for good; the errors of what is left."""
        parent = el.getparent()
        known = self._memo.get((id(parent), (id(el),)))
        parent.remove(el)
        self._memo.clear()
        self.ordered = known[2] if known is not None else self._validate()
        self.base = frozenset(self.ordered)
        return self.base


# Up to this many children, one by one: cheap, and of two duplicates the later one is
# named (halving may name the earlier: both are a correct answer, the later reads better).
_ONE_BY_ONE = 32


def _fixing_child(work: _Work, el: Any, fixed: Callable[[Errors], bool]) -> Any:
    """The child of ``el`` whose removal ``fixed`` the errors, or None.

    Halving first: ``el`` keeps only one half of the children; if that alone fixes the
    errors the child is in the other half, otherwise in this one. The document shrinks at
    every step, and libxml2 validates an invalid document more slowly the more children
    it has, so one fault among n children costs about log n validations of ever smaller
    documents instead of n of the whole one (8,000 <hostdev> took minutes). The one child
    found is then checked on the whole document; where it is not the one (several faults
    acting together), the children are tried one by one as before."""
    kids = _children(el)
    if len(kids) <= _ONE_BY_ONE:
        return next((c for c in kids if fixed(work.without(el, [c]))), None)
    group = kids
    while len(group) > 1:
        later, earlier = group[: len(group) // 2], group[len(group) // 2 :]
        keep = {id(c) for c in later}
        others = [c for c in kids if id(c) not in keep]
        group = earlier if fixed(work.without(el, others)) else later
    if group and fixed(work.without(el, group)):
        return group[0]
    # Of each tag, at most _ONE_BY_ONE children are tried: children of one tag are alike to
    # the schema, so where removing that many of them singly fixes nothing, another does not
    # either (10,000 failing <hostdev> each tried on the whole document took minutes).
    tried: dict[str, int] = {}
    for child in kids:
        if child is (group[0] if group else None):
            continue
        tried[child.tag] = tried.get(child.tag, 0) + 1
        if tried[child.tag] <= _ONE_BY_ONE and fixed(work.without(el, [child])):
            return child
    return None


def _descend(work: _Work, start: Any, fixed: Callable[[Errors], bool]) -> Any:
    """From ``start``, step into the child whose removal ``fixed`` the errors, until none
    does: that element is the one at fault."""
    el = start
    while (child := _fixing_child(work, el, fixed)) is not None:
        el = child
    return el


def _culprit(work: _Work) -> Any:
    # One fault: taking the element at fault (or its ancestor) away removes errors.
    base, top_el = work.base, work.doc
    el = _descend(work, top_el, lambda after: after < base)
    if el is not top_el:
        return el
    # Several faults under different children: libxml2 names the first failing child of
    # the root in its message ("Extra element features in interleave"); inside that child,
    # the element at fault is the one whose removal clears the blame on it.
    tree = top_el.getroottree()
    root = tree.getpath(top_el)

    def blamed(top: Any, errors: Errors) -> bool:
        word = re.compile(rf"\b{re.escape(str(top.tag))}\b")
        mine = tree.getpath(top)
        return any(
            (path == root and word.search(msg)) or path == mine or path.startswith(mine + "/")
            for path, msg in errors
        )

    named = [top for top in reversed(_children(top_el)) if blamed(top, base)]
    if named:  # document order: libxml2 names the first
        top = named[0]
        return _descend(work, top, lambda after: not blamed(top, after))
    return top_el  # e.g. a required element missing: the root is at fault


def faults(rng: Any, doc: Any) -> list[SchemaFault]:
    """The elements the schema rejects in ``doc`` (empty when it is valid)."""
    if rng.validate(doc):
        return []
    import copy  # only for an invalid file: valid ones are the start-up that matters

    first = _errors_of(rng)
    copied = copy.deepcopy(doc)
    # the copy's errors are the document's own (same paths, same messages): not asked again
    work = _Work(rng, copied, first)
    # map copies back to the caller's elements (lxml keeps one proxy while referenced)
    origin = dict(zip(copied.iter(), doc.iter(), strict=True))
    out: list[SchemaFault] = []
    while work.base and len(out) < MAX_FAULTS:
        el = _culprit(work)
        message = _message(work, el)
        if el is copied and first and first[0][1] not in message:
            message += f" ({first[0][1]})"
        out.append(SchemaFault(origin[el], message))
        if el.getparent() is None:
            break  # the root itself: nothing to take away
        before = work.base
        if work.remove(el) == before:  # then look for the next fault
            break
    return sorted(out, key=lambda f: f.element.sourceline or 0)


def _message(work: _Work, el: Any) -> str:
    """Name the element as written; add libxml2's words only when they are about it
    (its own messages about the parent would mislead). The errors are those of the
    document as it is (the search puts back all it takes away)."""
    path = el.getroottree().getpath(el)
    mine = [msg for p, msg in work.ordered if p == path]
    attrs = "".join(f" {k}='{v}'" for k, v in el.attrib.items())
    said = f": {mine[0]}" if mine else ""
    return f"the schema rejects <{el.tag}{attrs}> here{said}"
