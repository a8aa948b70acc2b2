# SPDX-License-Identifier: Apache-2.0
"""A layout file: the vGPUs of each card, by type name, in YAML.

    # passthrough vgpu apply --layout vgpu.yaml
    cards:
      "0000:41:00.0": {L40S-12Q: 4}
      "0000:c1:00.0": {L40S-24Q: 2}
      "0000:81:00.0": {L40S-24Q: 1, L40S-12Q: 2, heterogeneous: true}

A card takes one type, unless its entry says ``heterogeneous: true``: a card holds one
framebuffer size until heterogeneous mode is set, and apply sets it only when asked (the
mode changes how the card places every vGPU, so a layout is not switched into it by a
second type written by mistake). Addresses are quoted: unquoted, YAML 1.1 reads
``0000:41:00.0`` as a base-60 number.
"""

from __future__ import annotations

from typing import Any

from passthrough.inputs import Unreadable, read_text
from passthrough.vgpu.plan import LayoutRefused

Entry = tuple[str, list[tuple[str, int]], bool]  # card, (type name, count)..., heterogeneous


def load_layout(path: str) -> list[Entry]:
    """(card, [(type name, count), ...], heterogeneous) for each card of the file;
    LayoutRefused naming the problem."""
    import yaml

    where = f"--layout {path}"
    try:
        loaded: Any = yaml.safe_load(read_text(path, "a vGPU layout file"))
    except Unreadable as exc:
        raise LayoutRefused(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}: " if mark is not None else ""
        raise LayoutRefused(f"{where}: {at}not valid YAML") from None
    cards = loaded.get("cards") if isinstance(loaded, dict) else None
    if not isinstance(cards, dict) or not cards:
        raise LayoutRefused(f"{where}: expected 'cards:' mapping each card to {{TYPE: COUNT}}")
    return parse_layout(cards, where)


def parse_layout(cards: Any, where: str) -> list[Entry]:
    """(card, [(type name, count), ...], heterogeneous) for each card of a mapping of card
    address to {TYPE: COUNT} (a layout file's ``cards:``, the host role's
    ``passthrough_host_vgpu_layout``); LayoutRefused naming ``where`` and the problem."""
    if not isinstance(cards, dict) or not cards:
        raise LayoutRefused(f"{where}: expected a mapping of each card to {{TYPE: COUNT}}")
    out: list[Entry] = []
    for card, given in cards.items():
        if not isinstance(card, str) or _number(card):
            raise LayoutRefused(f'{where}: card {card!r}: quote the address ("0000:41:00.0")')
        types = dict(given) if isinstance(given, dict) else {}
        mixed = types.pop("heterogeneous", False)
        if not isinstance(mixed, bool):
            raise LayoutRefused(f"{where}: {card}: heterogeneous: true or false, not {mixed!r}")
        if not types:
            raise LayoutRefused(f"{where}: {card}: expected {{TYPE: COUNT}} ({{L40S-12Q: 4}})")
        if len(types) > 1 and not mixed:
            raise LayoutRefused(
                f"{where}: {card}: one type per card ({{L40S-12Q: 4}}), or several with "
                "'heterogeneous: true' (a card holds one framebuffer size until that mode is set)"
            )
        wants = []
        for name, count in types.items():
            if not isinstance(name, str) or isinstance(count, bool) or not isinstance(count, int):
                raise LayoutRefused(
                    f"{where}: {card}: expected TYPE: COUNT, got {name!r}: {count!r}"
                )
            wants.append((name, count))
        out.append((card, wants, mixed))
    return out


def _number(key: str) -> bool:
    """A key that was a number before it became a string on the way (Ansible passes a
    module's mapping as JSON): an unquoted address that YAML 1.1 read as base 60."""
    try:
        float(key)
    except ValueError:
        return False
    return True
