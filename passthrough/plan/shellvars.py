"""Reading the shell assignments of /etc/default/grub (and its grub.d drop-ins) safely.

grub-mkconfig *sources* these files, so they are shell. We understand the subset that
real files use — ``NAME=value``, single and double quotes, backslash escapes, comments and
``$NAME`` / ``${NAME}`` references to the variables being read — and refuse anything else
(command substitution, other variables, CRLF) with the file and line, rather than guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from passthrough.plan.kargs import UnsafeCmdline

ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
REF = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


@dataclass(frozen=True)
class Assignment:
    name: str
    value: str
    path: str
    line: int


def _expand(text: str, known: dict[str, str], where: str) -> str:
    def sub(m: re.Match[str]) -> str:
        name = m[1] or m[2]
        if name not in known:
            raise UnsafeCmdline(where, f"refers to ${name}, which the planner cannot evaluate")
        return known[name]

    if "`" in text or "$(" in text:
        raise UnsafeCmdline(where, "uses command substitution")
    if "$" in REF.sub("", text):
        raise UnsafeCmdline(where, "has a $ the planner cannot evaluate")
    return REF.sub(sub, text)


def parse_value(raw: str, known: dict[str, str], where: str) -> str:
    """The value of a shell assignment's right-hand side (one word, quotes removed)."""
    out: list[str] = []
    i = 0
    n = len(raw)
    while i < n:
        c = raw[i]
        if c == "'":
            end = raw.find("'", i + 1)
            if end < 0:
                raise UnsafeCmdline(where, "unterminated single quote")
            out.append(raw[i + 1 : end])
            i = end + 1
        elif c == '"':
            j = i + 1
            plain: list[str] = []
            while j < n and raw[j] != '"':
                if raw[j] == "\\" and j + 1 < n and raw[j + 1] in '"\\$`':
                    out.append(_expand("".join(plain), known, where))
                    plain = []
                    out.append(raw[j + 1])  # escaped: literal, never expanded
                    j += 2
                    continue
                plain.append(raw[j])
                j += 1
            if j >= n:
                raise UnsafeCmdline(where, "unterminated double quote")
            out.append(_expand("".join(plain), known, where))
            i = j + 1
        elif c == "\\" and i + 1 < n:
            out.append(raw[i + 1])
            i += 2
        elif c in " \t":
            rest = raw[i:].strip()
            if rest and not rest.startswith("#"):
                raise UnsafeCmdline(where, "has an unquoted space in the value")
            break
        elif c == "#" and not out:
            break
        elif c in ";&|<>()":
            raise UnsafeCmdline(where, f"has shell syntax {c!r} the planner does not evaluate")
        else:
            j = i
            while j < n and raw[j] not in " \t'\"\\;&|<>()":
                j += 1
            out.append(_expand(raw[i:j], known, where))
            i = j
    return "".join(out)


def read_assignments(
    text: str, path: str, names: set[str], known: dict[str, str]
) -> list[Assignment]:
    """Assignments to ``names`` in file order, evaluating references as the shell would;
    ``known`` is updated as the shell's variables would be."""
    if "\r" in text:
        raise UnsafeCmdline(
            path,
            "has CRLF line endings (grub-mkconfig would read them too): convert it with dos2unix",
        )
    found: list[Assignment] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        number = i + 1
        while line.endswith("\\") and i + 1 < len(lines):  # continuation lines
            i += 1
            line = line[:-1] + lines[i]
        i += 1
        m = ASSIGN.match(line)
        if m is None or m[1] not in names:
            if any(re.search(rf"\b{n}\b", line.split("#", 1)[0]) for n in names):
                raise UnsafeCmdline(
                    f"{path}:{number}", "sets the command line in a way the planner does not parse"
                )
            continue
        value = parse_value(m[2], known, f"{path}:{number}")
        known[m[1]] = value
        found.append(Assignment(m[1], value, path, number))
    return found


def quote(value: str) -> str:
    """Double-quoted for a shell file, escaping what the shell would interpret."""
    return '"' + re.sub(r'(["\\$`])', r"\\\1", value) + '"'
