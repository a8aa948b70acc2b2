# SPDX-License-Identifier: Apache-2.0
"""What reaches a terminal is inert (issue 30, item 7): escape sequences and lone carriage
returns from files, journals or Ansible are shown escaped; our own colours, newlines, tabs and
a CR-LF line end (Ansible's output through a pty) pass as they are."""

from __future__ import annotations

from passthrough.inert import RESET, STYLES, inert


def test_an_escape_sequence_and_a_lone_cr_are_escaped() -> None:
    # a forged "clear the screen, then overwrite the line" from a journal or a device string
    assert inert("ok\x1b[2J\rNo command pending.") == "ok\\x1b[2J\\x0dNo command pending."
    assert inert("bell\x07 del\x7f c1\x9b") == "bell\\x07 del\\u007f c1\\u009b"


def test_line_ends_tabs_and_our_colours_pass() -> None:
    text = f"{STYLES['red']}FAIL{RESET}\tcheck\r\n--- before: /etc/x\r\n+++ after\n"
    assert inert(text) == text


def test_clean_text_is_returned_as_it_is_and_each_control_still_caught() -> None:
    # the fast path (no control character: the text itself) must not let one through
    for text in ("plain ascii\n", "GH100 [H100] — naïve\t\n"):
        assert inert(text) is text
    for c in [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)]:
        for around in ("a{}b", "ü{}b"):
            assert inert(around.format(chr(c))) != around.format(chr(c)), hex(c)
