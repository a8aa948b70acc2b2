# SPDX-License-Identifier: Apache-2.0
"""Declarative fields over an lxml element: a field is declared once, as a path and a
converter, and that one declaration both reads and writes it.

    class Hidden(XMLObject):
        state = XMLField("kvm/hidden/@state", ON_OFF)

``Hidden(el).state`` reads ``<kvm><hidden state='on'/></kvm>`` below ``el`` (None where an
element on the way or the attribute is missing, or the converter cannot read the value);
``Hidden(el).state = True`` writes it, making the elements on the way (with the attribute a
step's ``[@name='value']`` asks for); ``= None`` removes the attribute (or the text).

A path is steps separated by ``/``: a tag (``hostdev``, ``*`` for any element, a prefix from
:data:`passthrough.vm.xmlns.NSMAP` such as ``qemu:arg``) with at most one
``[@name='value']`` test; a last step ``@name`` reads an attribute, none reads the text. A
step takes the first child that fits, as ElementTree's ``find`` does.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Generic, TypeAlias, TypeVar, overload

from lxml import etree

from passthrough.vm.xmlns import NSMAP

T = TypeVar("T")
Obj = TypeVar("Obj", bound="XMLObject")

Element: TypeAlias = etree._Element

_STEP = re.compile(
    r"(?P<tag>\*|[A-Za-z_][\w.-]*(?::[A-Za-z_][\w.-]*)?)(?:\[@(?P<attr>[\w.-]+)='(?P<value>[^']*)'\])?"
)


def sourceline(el: Element) -> int:
    """The line ``el`` starts on in the text it was parsed from (0: not known)."""
    line = getattr(el, "sourceline", None)
    return line if isinstance(line, int) else 0


class Step:
    __slots__ = ("attr", "tag", "value")

    def __init__(self, text: str) -> None:
        m = _STEP.fullmatch(text)
        if m is None:
            raise ValueError(f"not a path step: {text!r}")
        prefix, _, local = m["tag"].rpartition(":")
        self.tag = f"{{{NSMAP[prefix]}}}{local}" if prefix else local
        self.attr: str | None = m["attr"]
        self.value: str = m["value"] or ""

    def fits(self, el: Element) -> bool:
        if not isinstance(el.tag, str):
            return False  # a comment or a processing instruction
        if self.tag != "*" and el.tag != self.tag:
            return False
        return self.attr is None or el.get(self.attr) == self.value

    def first(self, parent: Element | None) -> Element | None:
        """The first child of ``parent`` that fits (None where none does)."""
        if parent is None:
            return None
        if self.attr is None and self.tag != "*":
            return next(parent.iterchildren(self.tag), None)  # the same, found by lxml
        return next((c for c in parent if self.fits(c)), None)

    def find_or_make(self, parent: Element) -> Element:
        found = self.first(parent)
        return found if found is not None else self.make(parent)

    def make(self, parent: Element) -> Element:
        if self.tag == "*":
            raise ValueError("a '*' step cannot be written")
        el = etree.SubElement(parent, self.tag)
        if self.attr is not None:
            el.set(self.attr, self.value)
        return el


class Path:
    """A parsed field path (module docstring): element steps, then an attribute or the text."""

    __slots__ = ("attr", "steps", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        parts = [p for p in text.split("/") if p and p != "."]
        self.attr = parts.pop()[1:] if parts and parts[-1].startswith("@") else None
        self.steps = [Step(p) for p in parts]

    def find(self, el: Element) -> Element | None:
        """The element the path names below ``el`` (the first that fits each step)."""
        here: Element | None = el
        for step in self.steps:
            here = step.first(here)
        return here

    def findall(self, el: Element) -> list[Element]:
        """Every element that fits the last step, below the first fit of the steps before."""
        if not self.steps:
            return [el]
        *head, last = self.steps
        here: Element | None = el
        for step in head:
            here = step.first(here)
        return [] if here is None else [c for c in here if last.fits(c)]

    def make(self, el: Element) -> Element:
        """The element the path names below ``el``, made (with every step before) if missing."""
        here = el
        for step in self.steps:
            here = step.find_or_make(here)
        return here


class Converter(Generic[T]):
    """Text to a value (None: unreadable) and back."""

    __slots__ = ("format", "parse")

    def __init__(self, parse: Callable[[str], T | None], format: Callable[[T], str]) -> None:
        self.parse = parse
        self.format = format


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _on_off(text: str) -> bool | None:
    return {"on": True, "off": False}.get(text)


STR: Converter[str] = Converter(lambda s: s, str)
INT: Converter[int] = Converter(_int, str)  # decimal, as libvirt writes sizes and counts
ON_OFF: Converter[bool] = Converter(_on_off, lambda b: "on" if b else "off")


class XMLObject:
    """An element, read and written through the fields its class declares."""

    __slots__ = ("element",)

    def __init__(self, element: Element) -> None:
        self.element = element


class XMLField(Generic[T]):
    """One value at ``path`` below an object's element, read and written by ``converter``."""

    def __init__(self, path: str, converter: Converter[T]) -> None:
        self.path = Path(path)
        self.converter = converter

    @overload
    def __get__(self, obj: None, owner: type[XMLObject]) -> XMLField[T]: ...
    @overload
    def __get__(self, obj: XMLObject, owner: type[XMLObject]) -> T | None: ...
    def __get__(self, obj: XMLObject | None, owner: type[XMLObject]) -> XMLField[T] | T | None:
        if obj is None:
            return self
        text = self.raw(obj)
        return None if text is None else self.converter.parse(text)

    def raw(self, obj: XMLObject) -> str | None:
        """The text as written, before the converter reads it."""
        node = self.path.find(obj.element)
        if node is None:
            return None
        text: str | None = node.text if self.path.attr is None else node.get(self.path.attr)
        return text

    def __set__(self, obj: XMLObject, value: T | None) -> None:
        if value is None:
            node = self.path.find(obj.element)
            if node is None:
                return
            if self.path.attr is None:
                node.text = None
            elif self.path.attr in node.attrib:
                del node.attrib[self.path.attr]
            return
        node = self.path.make(obj.element)
        text = self.converter.format(value)
        if self.path.attr is None:
            node.text = text
        else:
            node.set(self.path.attr, text)


class XMLChild(Generic[Obj]):
    """The first element at ``path``, as an ``kind`` (None where there is none)."""

    def __init__(self, kind: type[Obj], path: str) -> None:
        self.kind = kind
        self.path = Path(path)

    @overload
    def __get__(self, obj: None, owner: type[XMLObject]) -> XMLChild[Obj]: ...
    @overload
    def __get__(self, obj: XMLObject, owner: type[XMLObject]) -> Obj | None: ...
    def __get__(self, obj: XMLObject | None, owner: type[XMLObject]) -> XMLChild[Obj] | Obj | None:
        if obj is None:
            return self
        node = self.path.find(obj.element)
        return None if node is None else self.kind(node)

    def make(self, obj: XMLObject) -> Obj:
        """The child, made (with the elements on the way) where it is missing."""
        return self.kind(self.path.make(obj.element))


class XMLChildren(Generic[Obj]):
    """Every element at ``path`` (all that fit its last step), each as a ``kind``."""

    def __init__(self, kind: type[Obj], path: str) -> None:
        self.kind = kind
        self.path = Path(path)

    @overload
    def __get__(self, obj: None, owner: type[XMLObject]) -> XMLChildren[Obj]: ...
    @overload
    def __get__(self, obj: XMLObject, owner: type[XMLObject]) -> list[Obj]: ...
    def __get__(
        self, obj: XMLObject | None, owner: type[XMLObject]
    ) -> XMLChildren[Obj] | list[Obj]:
        if obj is None:
            return self
        return [self.kind(node) for node in self.path.findall(obj.element)]

    def add(self, obj: XMLObject) -> Obj:
        """A new child appended at the path (the elements on the way made where missing)."""
        *head, last = self.path.steps
        parent = obj.element
        for step in head:
            parent = step.find_or_make(parent)
        return self.kind(last.make(parent))
