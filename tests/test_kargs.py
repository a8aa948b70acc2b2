# SPDX-License-Identifier: Apache-2.0
"""Kernel-argument and GRUB-file editing: properties (hypothesis) and odd real-world files."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from passthrough.boot.grub import VARS
from passthrough.boot.linefiles import arguments, cmdline_arg_line, edit_lines, options_line
from passthrough.boot.shellvalue import Origin, ShellVars, parse_value, quote
from passthrough.boot.shellvars import read_assignments, source
from passthrough.kargs import ArgChange, UnsafeCmdline, edit, invert, key_of, needed

KEYS = [
    "quiet",
    "splash",
    "ro",
    "root",
    "intel_iommu",
    "iommu",
    "vfio-pci.ids",
    "console",
    "nomodeset",
    "mitigations",
]
VALUE = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789:,./-", min_size=1, max_size=12)
ARG = st.builds(
    lambda k, v: k if v is None else f"{k}={v}", st.sampled_from(KEYS), st.none() | VALUE
)
NEW_KEYS = ["pt_a", "pt_b", "vfio_pci.disable_vga", "hugepages"]


@st.composite
def changes(draw: st.DrawFn) -> ArgChange:
    to_set = draw(st.dictionaries(st.sampled_from(KEYS + NEW_KEYS), VALUE, max_size=4))
    # a key is set or dropped, never both, in either spelling of a module parameter
    setting = {key_of(k) for k in to_set}
    drop = frozenset(
        k
        for k in draw(st.frozensets(st.sampled_from(KEYS), max_size=3))
        if key_of(k) not in setting
    )
    return ArgChange(set={k: f"{k}={v}" for k, v in to_set.items()}, drop=drop)


@given(st.lists(ARG, max_size=12), changes())
def test_unrelated_arguments_keep_their_order(args: list[str], change: ArgChange) -> None:
    touched = set(change.set) | set(change.drop)
    before = [a for a in args if key_of(a) not in touched]
    after = [a for a in edit(args, change) if key_of(a) not in touched]
    assert after == before


@given(st.lists(ARG, max_size=12), changes())
def test_editing_is_idempotent_and_leaves_nothing_needed(
    args: list[str], change: ArgChange
) -> None:
    once = edit(args, change)
    assert edit(once, change) == once
    assert needed(once, change).is_empty()
    for key, arg in change.set.items():
        assert [a for a in once if key_of(a) == key] == [arg]
    assert not any(key_of(a) in change.drop for a in once)


@given(st.lists(ARG, max_size=12, unique_by=key_of), changes())
def test_add_then_remove_is_the_identity(args: list[str], change: ArgChange) -> None:
    fresh = {k: v for k, v in change.set.items() if k not in {key_of(a) for a in args}}
    added = edit(args, ArgChange(set=fresh))
    assert edit(added, ArgChange(drop=frozenset(fresh))) == args
    # and the inverse of any change restores an argument list without duplicate keys
    changed = edit(args, change)
    assert sorted(edit(changed, invert(args, change))) == sorted(args)


def test_module_parameters_compare_with_dash_and_underscore() -> None:
    assert key_of("vfio_pci.ids=10de:2684") == key_of("vfio-pci.ids=1")
    out = edit(
        ["quiet", "vfio_pci.ids=10de:1b80"],
        ArgChange(set={"vfio-pci.ids": "vfio-pci.ids=10de:2684"}),
    )
    assert out == ["quiet", "vfio-pci.ids=10de:2684"]


VALUE_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=40)


@settings(max_examples=200)
@given(VALUE_TEXT)
def test_quote_round_trips_through_the_parser(value: str) -> None:
    assert parse_value(quote(value), {}, "test") == value


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n', "quiet splash"),
        ("GRUB_CMDLINE_LINUX_DEFAULT='quiet splash'\n", "quiet splash"),
        ("GRUB_CMDLINE_LINUX_DEFAULT=quiet\n", "quiet"),
        ('GRUB_CMDLINE_LINUX_DEFAULT="quiet"  # a comment\n', "quiet"),
        ('  export GRUB_CMDLINE_LINUX_DEFAULT="a"\n', "a"),
        ('GRUB_CMDLINE_LINUX_DEFAULT="a"\nGRUB_CMDLINE_LINUX_DEFAULT="b"\n', "b"),  # last wins
        (
            'GRUB_CMDLINE_LINUX_DEFAULT="a"\nGRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT b"\n',
            "a b",
        ),
        ('GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT:+}"\n', None),
        ('# GRUB_CMDLINE_LINUX_DEFAULT="commented"\nGRUB_CMDLINE_LINUX_DEFAULT="x"\n', "x"),
        ('GRUB_CMDLINE_LINUX_DEFAULT="quiet \\"q\\" \\$HOME"\n', 'quiet "q" $HOME'),
        ('GRUB_CMDLINE_LINUX_DEFAULT="a \\\nb"\n', "a b"),
    ],
)
def test_grub_assignments(text: str, expected: str | None) -> None:
    known = {"GRUB_CMDLINE_LINUX_DEFAULT": ""}
    if expected is None:
        with pytest.raises(UnsafeCmdline):
            read_assignments(text, "/etc/default/grub", {"GRUB_CMDLINE_LINUX_DEFAULT"}, known)
        return
    read_assignments(text, "/etc/default/grub", {"GRUB_CMDLINE_LINUX_DEFAULT"}, known)
    assert known["GRUB_CMDLINE_LINUX_DEFAULT"] == expected


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('GRUB_CMDLINE_LINUX_DEFAULT="quiet"\r\n', "CRLF"),
        ('GRUB_CMDLINE_LINUX_DEFAULT="$(cat /proc/cmdline)"\n', "command substitution"),
        ("GRUB_CMDLINE_LINUX_DEFAULT=`id`\n", "command substitution"),
        ('GRUB_CMDLINE_LINUX_DEFAULT="$OTHER quiet"\n', "$OTHER"),
        ('GRUB_CMDLINE_LINUX_DEFAULT="unterminated\n', "unterminated"),
        ("GRUB_CMDLINE_LINUX_DEFAULT=a b\n", "unquoted space"),
        ('[ -n "$X" ] && GRUB_CMDLINE_LINUX_DEFAULT="a"\n', "does not parse"),
        # set inside if/elif: which branch runs is decided when the shell runs
        (
            'if lspci | grep -q NVIDIA; then\n  GRUB_CMDLINE_LINUX_DEFAULT="nvidia-drm.modeset=1"\n'
            'elif true; then\n  GRUB_CMDLINE_LINUX_DEFAULT="quiet"\nfi\n',
            "/etc/default/grub:2: sets GRUB_CMDLINE_LINUX_DEFAULT inside a conditional",
        ),
        (
            'f() {\n GRUB_CMDLINE_LINUX_DEFAULT="x"\n}\n',
            ":2: sets GRUB_CMDLINE_LINUX_DEFAULT inside",
        ),
        ('eval "$(cat /etc/extra)"\n', ":1: uses eval"),
        ("source grub.local\n", ":1: sources grub.local by a relative name"),
        (". /etc/default/grub.local\n", "sources /etc/default/grub.local, which this root"),
        ("unset GRUB_CMDLINE_LINUX_DEFAULT\n", ":1: sets the command line in a way"),
    ],
)
def test_grub_files_the_planner_refuses_name_file_and_line(text: str, needle: str) -> None:
    with pytest.raises(UnsafeCmdline) as info:
        read_assignments(
            text,
            "/etc/default/grub",
            {"GRUB_CMDLINE_LINUX_DEFAULT"},
            {"GRUB_CMDLINE_LINUX_DEFAULT": ""},
        )
    assert needle in str(info.value) and "/etc/default/grub" in str(info.value)


def test_lines_that_set_other_variables_are_skipped_even_with_commands() -> None:
    known = {"GRUB_CMDLINE_LINUX_DEFAULT": ""}
    text = (
        "GRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`\n"
        "GRUB_DISTRIBUTOR=\"$(awk -F= '/NAME/ {print $2}' \\\n /etc/os-release)\"\n"
        "if [ -e /sys/firmware/efi ]; then GRUB_TIMEOUT=1; fi\n"
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet # not a comment"  # a comment\n'
        "export GRUB_CMDLINE_LINUX_DEFAULT\n"
    )
    read_assignments(text, "/etc/default/grub", {"GRUB_CMDLINE_LINUX_DEFAULT"}, known)
    assert known["GRUB_CMDLINE_LINUX_DEFAULT"] == "quiet # not a comment"


def test_a_sourced_file_is_read_as_the_shell_reads_it() -> None:
    files = {"/etc/default/grub.local": 'GRUB_CMDLINE_LINUX="rd.luks.uuid=abc root=/dev/x"\n'}
    state = ShellVars(frozenset(VARS))
    source(
        'GRUB_CMDLINE_LINUX="ro"\n. /etc/default/grub.local\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\n',
        "/etc/default/grub",
        state,
        files.get,
    )
    assert state.value("GRUB_CMDLINE_LINUX") == "rd.luks.uuid=abc root=/dev/x"
    # every word knows where it was written: a removal edits that file and line
    assert state.words("GRUB_CMDLINE_LINUX")[1] == (
        "root=/dev/x",
        Origin("/etc/default/grub.local", 1, 1),
    )


def test_words_built_from_two_places_have_no_single_origin() -> None:
    state = ShellVars(frozenset(VARS))
    text = 'GRUB_CMDLINE_LINUX="a"\nGRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX}b c"\n'
    source(text, "/g", state)
    assert state.words("GRUB_CMDLINE_LINUX") == [("ab", None), ("c", Origin("/g", 2, 2))]


CMDLINE_CASES = [
    # comments stay comments: the argument line gets ours, nothing else moves
    (
        "# root on LUKS\n# nosmt\ncryptdevice=UUID=1:root root=/dev/mapper/root rw\n",
        ArgChange(set={"iommu": "iommu=pt"}),
        "# root on LUKS\n# nosmt\ncryptdevice=UUID=1:root root=/dev/mapper/root rw iommu=pt\n",
    ),
    # an argument that must go goes from the line it is on; no final newline is kept so
    (
        "root=/dev/sda2 intel_iommu=off\nquiet",
        ArgChange(set={"intel_iommu": "intel_iommu=on"}),
        "root=/dev/sda2\nquiet intel_iommu=on",
    ),
    # only comments: ours on a line of its own
    ("# nothing yet\n", ArgChange(set={"iommu": "iommu=pt"}), "# nothing yet\niommu=pt\n"),
]


@pytest.mark.parametrize(("text", "change", "expected"), CMDLINE_CASES)
def test_kernel_cmdline_keeps_its_lines(text: str, change: ArgChange, expected: str) -> None:
    assert edit_lines(text, change, cmdline_arg_line, "") == expected
    assert arguments(expected, cmdline_arg_line, is_options=False)[-1] != "#"


def test_every_options_line_of_a_loader_entry_counts() -> None:
    entry = "title Arch\nlinux /vmlinuz\noptions root=/dev/sda2 rw\noptions intel_iommu=off quiet\n"
    assert arguments(entry, options_line, is_options=True) == [
        "root=/dev/sda2",
        "rw",
        "intel_iommu=off",
        "quiet",
    ]
    new = edit_lines(
        entry, ArgChange(set={"intel_iommu": "intel_iommu=on"}), options_line, "options "
    )
    assert new == (
        "title Arch\nlinux /vmlinuz\noptions root=/dev/sda2 rw\noptions quiet intel_iommu=on\n"
    )


def test_a_key_both_set_and_dropped_is_no_change() -> None:
    """One key, one meaning: setting and dropping it at once is refused where the change is
    made (either spelling of a dotted module parameter)."""
    with pytest.raises(ValueError, match="both set and dropped: \\['hugepages'\\]"):
        ArgChange(set={"hugepages": "hugepages=8"}, drop=frozenset({"hugepages"}))
    with pytest.raises(ValueError, match=r"vfio-pci\.ids"):
        ArgChange(set={"vfio_pci.ids": "vfio-pci.ids=10de:2684"}, drop=frozenset({"vfio-pci.ids"}))
    assert ArgChange(set={"iommu": "iommu=pt"}, drop=frozenset({"hugepages"})).drop == {"hugepages"}
