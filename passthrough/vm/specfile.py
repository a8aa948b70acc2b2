# SPDX-License-Identifier: Apache-2.0
"""``render --spec FILE.yaml``: VM options from YAML, through the options table.

YAML 1.1 (what PyYAML and Ansible read) turns some unquoted scalars into numbers the writer
did not mean: ``01:00.0`` is the base-60 float 60.0, ``010`` is octal 8. The loader keeps the
text as it was typed beside what YAML made of it, so the refusal can say which value to quote.
Duplicate keys (YAML keeps the last one silently) are refused too.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from passthrough.inputs import Unreadable, depth_bounded, read_text
from passthrough.records import frozen
from passthrough.vm.options import BY_KEY, BadVmSpec, Kind, check, size_mib, unknown_key

# integers YAML 1.1 reads in a base the writer probably did not mean
_OCTAL = re.compile(r"^[-+]?0[0-7_]+$")


@frozen
class Retyped:
    """A scalar YAML 1.1 turned into a number in a way the writer rarely means."""

    typed: str  # the text in the file
    read_as: int | float  # what YAML 1.1 makes of it

    def __repr__(self) -> str:
        return self.typed


class _Loader(depth_bounded()):  # type: ignore[misc]
    what = "a VM spec file"

    def compose_node(self, parent: Any, index: Any) -> Any:
        # A spec is a flat mapping of options: an alias (``*name``, ``<<: *name``) serves it
        # nothing, and a few hundred bytes of nested aliases expand to gigabytes.
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise BadVmSpec(
                f"line {mark.line + 1}", "YAML aliases (*name) are not accepted in a spec file"
            )
        return super().compose_node(parent, index)


def _number(loader: _Loader, node: yaml.ScalarNode, base: str) -> Any:
    value = (
        loader.bounded_int(node)  # inputs.depth_bounded: no integer of thousands of digits
        if base == "int"
        else yaml.SafeLoader.construct_yaml_float(loader, node)
    )
    text = str(node.value)
    if ":" in text or (base == "int" and _OCTAL.fullmatch(text)):
        return Retyped(text, value)
    return value


def _mapping(loader: _Loader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, Retyped):
            key = key.typed
        if not isinstance(key, str):
            raise BadVmSpec(f"line {key_node.start_mark.line + 1}", f"key {key!r} is not text")
        if key in out:
            raise BadVmSpec(key, f"given twice (line {key_node.start_mark.line + 1})")
        out[key] = loader.construct_object(value_node, deep=True)
    return out


def _int(loader: _Loader, node: yaml.ScalarNode) -> Any:
    return _number(loader, node, "int")


def _float(loader: _Loader, node: yaml.ScalarNode) -> Any:
    return _number(loader, node, "float")


_Loader.add_constructor("tag:yaml.org,2002:int", _int)
_Loader.add_constructor("tag:yaml.org,2002:float", _float)
_Loader.add_constructor("tag:yaml.org,2002:map", _mapping)


def _retyped(where: str, value: Retyped, kind: Kind) -> BadVmSpec:
    if kind is Kind.INT:
        return BadVmSpec(
            where,
            f"YAML reads {value.typed} as {value.read_as!r} (octal or base 60): "
            "write the number without a leading zero",
        )
    what = "the PCI address" if kind is Kind.CARDS else "it"
    return BadVmSpec(
        where,
        f'YAML reads {value.typed} as the number {value.read_as!r}: quote {what} ("{value.typed}")',
    )


def _convert(key: str, value: Any, where: str) -> tuple[str, Any]:
    """One key of the file → (VmOptions field, checked value)."""
    opt = BY_KEY[key]
    if value is None:
        raise BadVmSpec(where, "has no value (leave the key out for the default)")
    if isinstance(value, Retyped):
        raise _retyped(where, value, opt.kind)
    if opt.kind is Kind.CARDS:
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, Retyped):
                raise _retyped(where, item, opt.kind)
        value = tuple(items)
    elif opt.kind is Kind.SIZE and isinstance(value, str):
        value = size_mib(value, where)
    elif opt.kind is Kind.ROM and isinstance(value, bool):
        value = "on" if value else "off"  # YAML 1.1 reads unquoted on/off as booleans
    elif opt.kind in (Kind.TEXT, Kind.PATH, Kind.CHOICE) and not isinstance(value, str):
        raise BadVmSpec(where, f"{value!r} is not text (quote it)")
    return opt.name, check(opt, value, where)


def load_spec_file(path: str) -> dict[str, Any]:
    """VM options (VmOptions field → value) from a YAML file keyed like the render flags."""
    where = f"--spec {path}"
    try:
        text = read_text(path, "a VM spec file")
    except Unreadable as exc:
        raise BadVmSpec(where, str(exc)) from None
    try:
        loaded = yaml.load(text, Loader=_Loader)  # a SafeLoader subclass: no object tags
    except BadVmSpec as exc:
        raise BadVmSpec(f"{path}: {exc.field}", exc.why) from None
    except Unreadable as exc:
        raise BadVmSpec(where, str(exc)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise BadVmSpec(where, f"{at}{problem}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise BadVmSpec(where, "expected a mapping of VM options")
    values: dict[str, Any] = {}
    for raw_key, value in loaded.items():
        key = raw_key.replace("-", "_")
        if key not in BY_KEY:
            raise unknown_key(raw_key, where)
        name, checked = _convert(key, value, f"{path}: {raw_key}")
        if name in values:
            raise BadVmSpec(f"{path}: {raw_key}", "given twice (under another spelling)")
        values[name] = checked
    return values
