# SPDX-License-Identifier: Apache-2.0
"""Reading shell-sourced configuration (/etc/default/grub and its grub.d drop-ins) as the
shell does, for the few variables the planner cares about.

grub-mkconfig *sources* these files. We evaluate exactly what the shell would for our
variables — ``NAME=value`` with quotes, escapes and ``$NAME``/``${NAME}`` references to
them, ``export``, ``.``/``source`` of an absolute path (read from the same root) — and
refuse, with the file and line, anything whose effect on them we cannot prove: an
assignment inside ``if``/``case``/a loop/a function, ``eval``, a relative ``source``,
command substitution in their value, any other line that names them. Lines that only set
other variables (``GRUB_DISTRIBUTOR=`lsb_release …```) cannot change ours and are skipped.

Every character of a value carries where it was written (file and line), so an argument
we must remove is removed where the admin wrote it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Collection, Sequence

from passthrough.boot.shell_refuse import refuse_set
from passthrough.boot.shellvalue import (
    ASSIGN,
    Origin,
    ShellVars,
    evaluate,
    logical_lines,
    parse_value,
)
from passthrough.kargs import UnsafeCmdline
from passthrough.records import frozen

OPENERS = {"if", "case", "for", "while", "until", "select", "{"}
CLOSERS = {"fi", "esac", "done", "}"}
MAX_SOURCE_DEPTH = 8
MAX_LINES = 20000
# builtins that set a variable named by their arguments or by text they read: whatever
# they set, the planner cannot see it (printf only with -v)
SETTERS = {"eval", "read", "declare", "typeset", "local", "mapfile", "readarray", "let"}
# words after which the next word is still a command word
PREFIXES = {"command", "builtin", "exec", "nohup", "time", "!", "then", "do", "else", "elif"}
PREFIXES |= {"if", "while", "until", "{", "(", "sudo", "env"}


# The appending line boot/grub.py writes: each listed word goes onto the end of the target
# variable unless the kernel line (the variables named, joined by spaces) has it already,
# so sourcing it twice adds nothing twice. POSIX sh (dash and bash read it alike).
LOOP_VAR = "_passthrough_arg"
APPEND_MISSING = re.compile(
    rf"for {LOOP_VAR} in ([^;]*); do "
    r'case " ((?:\$\{[A-Za-z_][A-Za-z0-9_]*\} ?)+) " in '
    rf'\*" \$\{{{LOOP_VAR}\}} "\*\) ;; '
    rf'\*\) ([A-Za-z_][A-Za-z0-9_]*)="\$\{{\3\}} \$\{{{LOOP_VAR}\}}" ;; '
    rf"esac; done; unset {LOOP_VAR}"
)


def append_missing(target: str, seen: Collection[str], words: list[str]) -> str:
    """The line that appends each of ``words`` to ``target`` unless ``seen`` has it."""
    listed = " ".join(shlex.quote(w) for w in words)
    scope = " ".join(f"${{{n}}}" for n in seen)
    return (
        f'for {LOOP_VAR} in {listed}; do case " {scope} " in *" ${{{LOOP_VAR}}} "*) ;; '
        f'*) {target}="${{{target}}} ${{{LOOP_VAR}}}" ;; esac; done; unset {LOOP_VAR}'
    )


@frozen
class LoopLine:
    """Our appending line taken apart: what stands before its list of words (indent and
    ``for _passthrough_arg in ``), the words, what follows them, the variable it appends
    to and the variables whose words it looks through (``scope``)."""

    head: str
    words: tuple[str, ...]
    tail: str
    target: str
    scope: tuple[str, ...]

    def render(self, words: Sequence[str]) -> str:
        """The same line listing ``words`` (as ``append_missing`` quotes them)."""
        return self.head + " ".join(shlex.quote(w) for w in words) + self.tail


def loop_line(line: str) -> LoopLine | None:
    """Our appending line (``append_missing``) taken apart, or None where ``line`` is not
    one: the one reader of that line, for the planner and for undo's take-back."""
    body = line.strip()
    m = APPEND_MISSING.fullmatch(body)
    if m is None:
        return None
    try:
        words = tuple(shlex.split(m[1]))
    except ValueError:
        return None
    lead = line[: len(line) - len(line.lstrip())]
    trail = line[len(line.rstrip()) :]
    scope = tuple(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", m[2]))
    return LoopLine(lead + body[: m.start(1)], words, body[m.end(1) :] + trail, m[3], scope)


def loop_words(line: str) -> tuple[str, tuple[str, ...]] | None:
    """Our appending line as (the variable it appends to, the words it lists), or None
    where ``line`` is not one."""
    found = loop_line(line)
    return None if found is None else (found.target, found.words)


def is_our_line(line: str, target: str) -> bool:
    """Whether ``line`` is our appending line for ``target`` (and nothing else)."""
    found = loop_line(line)
    return found is not None and found.target == target


Reader = Callable[[str], str | None]  # an absolute path → its text (None: no such file)


def source(
    text: str, path: str, state: ShellVars, read: Reader | None = None, depth: int = 0
) -> None:
    """Update ``state`` as sourcing ``text`` (the file ``path``) would, or refuse."""
    if "\r" in text:
        raise UnsafeCmdline(
            path,
            "has CRLF line endings (grub-mkconfig would read them too): convert it with dos2unix",
        )
    lines = logical_lines(text, path)
    if len(lines) > MAX_LINES:
        raise UnsafeCmdline(path, f"has more than {MAX_LINES} lines")
    state.budget.spend(path, lines=len(lines), files=1)
    mention = re.compile(r"\b(" + "|".join(map(re.escape, sorted(state.names))) + r")\b")
    nesting = 0
    for first, last, code in lines:
        code = _strip(code)
        where = f"{path}:{first}"
        state.budget.spend(where)
        if not code:
            continue
        if _append_missing(code, state, where, Origin(path, first, last), nesting):
            continue
        words = re.split(r"[\s;]+", code)
        m = ASSIGN.match(code)
        if m is not None and m[1] in state.names:
            if nesting:
                raise UnsafeCmdline(
                    where,
                    f"sets {m[1]} inside a conditional, loop or function block: which value "
                    "the shell ends with is only known when it runs",
                )
            state.values[m[1]] = evaluate(m[2], state, where, Origin(path, first, last))
            continue
        if words[0] in (".", "source"):
            _source_line(words, state, where, read, depth, nesting)
            continue
        if _sources_grub_d(code, state, where, read, depth, nesting):
            continue
        _unseen_setters(code, state, where, plain=m is not None)
        if m is None:
            nesting += sum(w in OPENERS for w in words) - sum(w in CLOSERS for w in words)
            nesting = max(nesting, 0)
        if m is None and words[0] == "export" and all("=" not in w for w in words[1:]):
            continue  # marking a variable for export changes no value
        if mention.search(code):
            raise UnsafeCmdline(where, "sets the command line in a way the planner does not parse")


def _strip(code: str) -> str:
    """The line without surrounding blanks, but a blank after a backslash is escaped (a
    literal blank, not a continuation) and stays."""
    head = code.lstrip(" \t")
    tail = head.rstrip(" \t")
    backslashes = len(tail) - len(tail.rstrip("\\"))
    return head[: len(tail) + 1] if len(tail) < len(head) and backslashes % 2 else tail


def _outside_substitutions(code: str) -> str:
    """``code`` with each command substitution (`…` and $(…)) replaced by a plain word: it
    runs in a subshell, so nothing in it sets a variable of this shell."""
    out: list[str] = []
    i, n = 0, len(code)
    quote = ""
    while i < n:
        c = code[i]
        if c == "\\":
            out.append(code[i : i + 2])
            i += 2
            continue
        if quote == "'" or (c == "'" and not quote):
            quote = "" if quote == "'" else "'"
        elif c == '"':
            quote = "" if quote == '"' else '"'
        elif c == "`" or code.startswith("$(", i):
            i = _substitution_end(code, i)
            out.append("_")
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _substitution_end(code: str, i: int) -> int:
    """The index after the substitution starting at ``i`` (the end of ``code`` when it is
    unterminated: the caller's shlex then refuses the rest)."""
    if code[i] == "`":
        j = i + 1
        while j < len(code) and code[j] != "`":
            j += 2 if code[j] == "\\" else 1
        return j + 1
    depth, j, quote = 0, i + 1, ""
    while j < len(code):
        c = code[j]
        if c == "\\" and quote != "'":
            j += 2
            continue
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return j


def _commands(code: str, where: str) -> list[list[str]]:
    """Each simple command's words, quotes removed (``A""B`` is ``AB``), from the first
    command word on: leading assignments, keywords and wrappers such as ``command`` are
    skipped."""
    lex = shlex.shlex(_outside_substitutions(code), posix=True, punctuation_chars=";&|()<>")
    lex.whitespace_split = True
    lex.commenters = ""
    try:
        tokens = list(lex)
    except ValueError:
        raise UnsafeCmdline(where, "has quoting the planner does not parse") from None
    out: list[list[str]] = [[]]
    for token in tokens:
        if token and all(c in ";&|()<>" for c in token):
            out.append([])
        elif out[-1] or not (token in PREFIXES or ASSIGN.match(token)):
            out[-1].append(token)
    return [c for c in out if c]


def _unseen_setters(code: str, state: ShellVars, where: str, plain: bool) -> None:
    """Refuse a line that could set a variable without spelling it as a plain name:
    eval/read/declare/… in any spelling, printf -v, or one of ours named once quotes are
    removed (``export GRUB_CMDLINE_LINUX""_DEFAULT=…``)."""
    for words in _commands(code, where):
        name = words[0]
        refuse_set(words, where)  # set -f/-u/-n change how grub-mkconfig runs on
        if name in SETTERS or (name == "printf" and any(w.startswith("-v") for w in words)):
            raise UnsafeCmdline(where, f"uses {name}, which can set the command line unseen")
        if name in (".", "source"):
            raise UnsafeCmdline(
                where, "sources a file where the planner cannot tell whether it runs"
            )
        # ours named in a spelling the raw line does not have: quotes or escapes in it
        hidden = [w for w in words if w.split("=", 1)[0] in state.names and w not in code]
        if not plain and hidden:
            raise UnsafeCmdline(
                where, "names the command line in a spelling the planner does not parse"
            )


# a loop that sources every grub.d/*.cfg (Garuda's /etc/default/grub has one), as
# Debian's grub-mkconfig does after it
GRUB_D_LOOP = re.compile(
    r'for (\w+) in "?(?:\$\{sysconfdir\}|\$sysconfdir|/etc)"?/default/grub\.d/\*\.cfg ?; ?do '
    r'(?:if \[ -e "\$\{?\1\}?" \]; then )?(?:source|\.) "\$\{?\1\}?";? (?:fi; )?done'
)


def _sources_grub_d(
    code: str, state: ShellVars, where: str, read: Reader | None, depth: int, nesting: int
) -> bool:
    """Source each /etc/default/grub.d/*.cfg in byte order for such a loop."""
    if GRUB_D_LOOP.fullmatch(re.sub(r"[ \t]+", " ", code)) is None:
        return False
    if state.listdir is None or nesting:
        raise UnsafeCmdline(where, "sources /etc/default/grub.d/*.cfg where the planner cannot")
    names = sorted(
        (n for n in state.listdir("/etc/default/grub.d") if n.endswith(".cfg")), key=str.encode
    )
    for name in names:
        _source_line([".", f"/etc/default/grub.d/{name}"], state, where, read, depth, 0)
    return True


def _append_missing(code: str, state: ShellVars, where: str, here: Origin, nesting: int) -> bool:
    """Evaluate our own appending line (``append_missing``); False when ``code`` is not one."""
    m = APPEND_MISSING.fullmatch(code)
    if m is None:
        return False
    seen = re.findall(r"\$\{(\w+)\}", m[2])
    if nesting or not {m[3], *seen} <= state.names:
        raise UnsafeCmdline(where, "has passthrough's appending line where it cannot be evaluated")
    try:
        listed = shlex.split(m[1])
    except ValueError:
        raise UnsafeCmdline(where, "has passthrough's appending line with broken quoting") from None
    for word in listed:
        scope = " " + " ".join(state.value(n) for n in seen) + " "
        if f" {word} " not in scope:
            state.values[m[3]] = [*state.values.get(m[3], []), *((c, here) for c in " " + word)]
    return True


def _source_line(
    words: list[str], state: ShellVars, where: str, read: Reader | None, depth: int, nesting: int
) -> None:
    if len(words) != 2:
        raise UnsafeCmdline(where, "has a source line the planner does not parse")
    target = parse_value(words[1], {}, where)
    if nesting:
        raise UnsafeCmdline(where, f"sources {target} inside a block: whether it runs is unknown")
    if not target.startswith("/"):
        raise UnsafeCmdline(
            where,
            f"sources {target} by a relative name, looked up in a PATH the planner cannot know",
        )
    if depth >= MAX_SOURCE_DEPTH:
        raise UnsafeCmdline(where, f"sources files more than {MAX_SOURCE_DEPTH} deep")
    text = read(target) if read is not None else None
    if text is None:
        raise UnsafeCmdline(where, f"sources {target}, which this root does not have")
    source(text, target, state, read, depth + 1)


def read_assignments(text: str, path: str, names: Collection[str], known: dict[str, str]) -> None:
    """Source ``text`` for ``names`` (no ``source`` lines); ``known`` is updated as the
    shell's variables would be."""
    state = ShellVars(frozenset(names), {k: [(c, None) for c in known.get(k, "")] for k in names})
    source(text, path, state)
    known.update({k: state.value(k) for k in names})
