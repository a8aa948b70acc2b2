# SPDX-License-Identifier: Apache-2.0
"""Boot configuration files real people wrote, planned, applied, edited and undone.

Each file of ../shared/realworld/boot-configs/ (read there at run time, never copied into
the project) goes into a sample host's tree. The effective command line or module list is
then computed the way the boot tool itself computes it — bash sources the GRUB files and
mkinitcpio's concatenation (``env -i``, in a temporary directory, with stand-in ``lspci``
and ``lsb_release`` first on PATH); ``modprobe -c`` reads modprobe.d; comment lines of
/etc/kernel/cmdline are no arguments — before apply, after apply, and after an admin's
edit made after apply. The result must be the admin's configuration plus ours (or a
one-line refusal, exit 2, nothing written), the admin's edit must take effect, and undo
must give every file back byte for byte.

Where ../shared/realworld is missing (a clone outside CI) the tier fails and says so;
PASSTHROUGH_REALWORLD=skip skips it instead, and another value is the folder to read.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import pytest

from passthrough.actions import Plan
from passthrough.cli import main
from passthrough.errors import PassthroughError
from passthrough.host.discover import discover
from passthrough.host.root import HostRoot
from passthrough.journal.apply import apply
from passthrough.journal.undo import undo
from passthrough.kargs import ArgChange, key_of
from passthrough.plan.build import PlanOptions, make_plan

from .bootread import cmdline_args, dracut_drivers, grub_line, mkinitcpio_modules, modprobe_ids
from .test_plan import build

SETTING = os.environ.get("PASSTHROUGH_REALWORLD", "")
REALWORLD = (
    Path(SETTING)
    if SETTING not in ("", "skip")
    else Path(__file__).parents[1].parent / "shared" / "realworld"
)
BOOT = REALWORLD / "boot-configs"
HOSTS = {  # kind → (sample host, options)
    "grub-intel": ("iommu-off", PlanOptions(gpus=("01:00.0",), allow_boot_gpu=True)),
    "grub-amd": ("amd-b550-chipset", PlanOptions(gpus=("2d:00.0",), allow_boot_gpu=True)),
    "cmdline": ("root-nvme-in-group", PlanOptions(gpus=("0a:00.0",), allow_boot_gpu=True)),
    "mkinitcpio": ("root-nvme-in-group", PlanOptions(gpus=("0a:00.0",), allow_boot_gpu=True)),
    # a GRUB host: its kernel arguments take effect in a tree (grubby's would need grubby)
    "other": ("two-gpus-one-group", PlanOptions(gpus=("01:00.0", "02:00.0"), allow_boot_gpu=True)),
}


def _rows() -> list[dict[str, str]]:
    with (BOOT / "MANIFEST.tsv").open(newline="") as fh:
        return [r for r in csv.DictReader(fh, delimiter="\t") if r["file"].count("/") == 1]


def _cases() -> list[tuple[str, str, str]]:
    """(how it is tested, the file, its path where it came from)."""
    if not BOOT.is_dir():
        return [("missing", "", "")]
    out: list[tuple[str, str, str]] = []
    for row in _rows():
        # GRUB files: as Debian's grub-mkconfig reads them (grub.d too), on two hosts, and
        # as upstream's does (/etc/default/grub only: an Arch root, no update-grub)
        grub = ["grub-intel", "grub-amd", "grub-intel:upstream"]
        kinds = {"grub": grub}.get(row["kind"], [row["kind"]])
        if row["kind"] == "mkinitcpio":
            kinds = ["mkinitcpio:conf.d", "mkinitcpio:in-place"]
        out += [(kind, row["file"], row["path"]) for kind in kinds]
    return out


# -- helpers -----------------------------------------------------------------------------


def tree(root: Path) -> dict[str, bytes | None]:
    """Every file (bytes) and directory (None) outside our own state directory."""
    out: dict[str, bytes | None] = {}
    for dirpath, _dirs, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel.startswith("var/lib/passthrough") or rel in ("var", "var/lib"):
            continue  # our journal's directory and its parents stay
        out[rel] = None
        for name in filenames:
            p = Path(dirpath, name)
            out[os.path.relpath(p, root)] = (
                b"-> " + os.readlink(p).encode() if p.is_symlink() else p.read_bytes()
            )
    return out


def kept(before: list[str], change: ArgChange) -> list[str]:
    """The admin's arguments that stay: all but those the plan drops or sets otherwise."""
    return [a for a in before if key_of(a) not in change.drop and change.set.get(key_of(a), a) == a]


def refused(
    path: Path, opts: PlanOptions, error: PassthroughError, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI refuses the same way: one line, exit 2, nothing written."""
    before = tree(path)
    capsys.readouterr()
    args = [x for g in opts.gpus for x in ("--gpu", g)]
    args += ["--allow-boot-gpu"] if opts.allow_boot_gpu else []
    assert main(["apply", "--root", str(path), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(error) in err, err
    assert tree(path) == before


def planned(path: Path, opts: PlanOptions, capsys: pytest.CaptureFixture[str]) -> Plan | None:
    """The plan, or None where it is refused (and the CLI refuses alike: see ``refused``)."""
    try:
        return make_plan(HostRoot(str(path)), discover(str(path)), opts)[0]
    except PassthroughError as error:
        refused(path, opts, error, capsys)
        return None


def expect_args(before: list[str], after: list[str], change: ArgChange, append_all: bool) -> None:
    stay = kept(before, change)
    added = [a for a in change.set.values() if append_all or a not in stay]
    assert after == stay + added


def ours_in_effect(args: list[str], change: ArgChange) -> None:
    for key, arg in change.set.items():
        assert [a for a in args if key_of(a) == key][-1:] == [arg], (key, args)
    assert not [a for a in args if key_of(a) in change.drop]


# -- placing a file in a sample host, and an admin's edit after apply ---------------------


class Shape:
    """How one kind of file is placed, read back, and edited by its admin."""

    def __init__(self, path: Path, tmp: Path, source: Path, origin: str, variant: str) -> None:
        self.path, self.tmp, self.source, self.origin, self.variant = (
            path,
            tmp,
            source,
            origin,
            variant,
        )

    def place(self) -> None:
        raise NotImplementedError

    def read(self) -> list[str]:
        raise NotImplementedError

    def expect(self, before: list[str], after: list[str], plan: Plan) -> None:
        raise NotImplementedError

    def edit(self) -> tuple[Path, bytes, str]:
        """Make an admin's edit: the file edited, its bytes before, the word it adds."""
        raise NotImplementedError

    def still_ours(self, args: list[str], plan: Plan) -> None:
        ours_in_effect(args, plan.kernel_args)


def _append_line(file: Path, line: str) -> None:
    data = file.read_bytes() if file.exists() else b""
    sep = b"" if not data or data.endswith(b"\n") else b"\n"
    file.write_bytes(data + sep + line.encode() + b"\n")


class Grub(Shape):
    def place(self) -> None:
        shutil.copyfile(self.source, self.path / "etc/default/grub")
        grub_d = self.path / "etc/default/grub.d"
        grub_d.mkdir(parents=True, exist_ok=True)
        companions = self.source.with_name(self.source.name + ".d")
        for f in sorted(companions.glob("*")) if companions.is_dir() else []:
            shutil.copyfile(f, grub_d / f.name)

    @property
    def upstream(self) -> bool:
        return self.variant == "upstream"

    def read(self) -> list[str]:
        return grub_line(self.path, self.tmp, dropins=not self.upstream)

    def expect(self, before: list[str], after: list[str], plan: Plan) -> None:
        """The admin's arguments, then ours that they do not have already (our line appends
        only those); a grub.d file sourced after ours may add more."""
        ours_in_effect(after, plan.kernel_args)
        stay = kept(before, plan.kernel_args)
        rest = list(after)
        for arg in reversed(plan.kernel_args.set.values()):
            if arg not in stay:
                del rest[len(rest) - 1 - rest[::-1].index(arg)]
        assert rest == stay

    def edit(self) -> tuple[Path, bytes, str]:
        """nomodeset added where the admin's value is set (the last file before ours that
        sets it): inside their quotes when the line has them, else as a line of its own."""
        drop_ins = [] if self.upstream else (self.path / "etc/default/grub.d").glob("*.cfg")
        files = [
            self.path / "etc/default/grub",
            *sorted(p for p in drop_ins if p.name < "99-passthrough.cfg"),
        ]
        target = [f for f in files if "GRUB_CMDLINE_LINUX_DEFAULT=" in f.read_text()][-1:] or files[
            :1
        ]
        file = target[0]
        old = file.read_bytes()
        text = old.decode()
        found = list(re.finditer(r"^\s*(?:export\s+)?GRUB_CMDLINE_LINUX_DEFAULT=[\"']", text, re.M))
        if found:
            at = found[-1].end()
            file.write_text(text[:at] + "nomodeset " + text[at:])
        else:
            _append_line(file, 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT nomodeset"')
        return file, old, "nomodeset"


class Cmdline(Shape):
    FILE = "etc/kernel/cmdline"

    def place(self) -> None:
        shutil.copyfile(self.source, self.path / self.FILE)

    def read(self) -> list[str]:
        return cmdline_args(self.path)

    def expect(self, before: list[str], after: list[str], plan: Plan) -> None:
        expect_args(before, after, plan.kernel_args, append_all=False)
        comments = [ln for ln in self.source.read_text().split("\n") if ln.strip().startswith("#")]
        now = (self.path / self.FILE).read_text().split("\n")
        assert [ln for ln in now if ln.strip().startswith("#")] == comments

    def edit(self) -> tuple[Path, bytes, str]:
        file = self.path / self.FILE
        old = file.read_bytes()
        lines = old.decode().split("\n")
        args = [i for i, ln in enumerate(lines) if ln.strip() and not ln.strip().startswith("#")]
        if args:
            lines[args[-1]] += " nomodeset"
            file.write_text("\n".join(lines))
        else:
            _append_line(file, "nomodeset")
        return file, old, "nomodeset"


class Mkinitcpio(Shape):
    OURS: ClassVar[list[str]] = ["vfio_pci", "vfio", "vfio_iommu_type1"]

    def place(self) -> None:
        shutil.copyfile(self.source, self.path / "etc/mkinitcpio.conf")
        if self.variant == "conf.d":
            (self.path / "etc/mkinitcpio.conf.d").mkdir(exist_ok=True)

    def read(self) -> list[str]:
        return mkinitcpio_modules(self.path, self.tmp)

    def expect(self, before: list[str], after: list[str], plan: Plan) -> None:
        if self.variant == "conf.d":
            assert after == before + self.OURS
        else:
            assert after == [m for m in self.OURS if m not in before] + before

    def still_ours(self, args: list[str], plan: Plan) -> None:
        assert set(self.OURS) <= set(args)

    def edit(self) -> tuple[Path, bytes, str]:
        file = self.path / "etc/mkinitcpio.conf"
        old = file.read_bytes()
        text = old.decode()
        at = list(re.finditer(r"^\s*MODULES=[(\"]", text, re.M))[-1].end()
        file.write_text(text[:at] + "nvme " + text[at:])
        return file, old, "nvme"


class Other(Shape):
    """dracut.conf.d and modprobe.d files, under the name they had."""

    def _file(self) -> Path:
        folder = "dracut.conf.d" if ".dracut." in self.source.name else "modprobe.d"
        return self.path / "etc" / folder / Path(self.origin).name

    def place(self) -> None:
        shutil.copyfile(self.source, self._file())

    def read(self) -> list[str]:
        if ".dracut." in self.source.name:
            return dracut_drivers(self.path, self.tmp)
        return modprobe_ids(self.path)

    def ours(self, plan: Plan) -> list[str]:
        if ".dracut." in self.source.name:
            return Mkinitcpio.OURS
        return plan.target_args.set["vfio-pci.ids"].partition("=")[2].split(",")

    def expect(self, before: list[str], after: list[str], plan: Plan) -> None:
        assert set(before) | set(self.ours(plan)) <= set(after)

    def still_ours(self, args: list[str], plan: Plan) -> None:
        assert set(self.ours(plan)) <= set(args)

    def edit(self) -> tuple[Path, bytes, str]:
        file = self._file()
        old = file.read_bytes()
        if ".dracut." in self.source.name:
            _append_line(file, 'force_drivers+=" nvme "')
            return file, old, "nvme"
        # modprobe: the admin binds one more device in a file of their own read after ours
        ids = ",".join([*modprobe_ids(self.path), "1af4:1041"])
        _append_line(self.path / "etc/modprobe.d/zz-admin.conf", f"options vfio-pci ids={ids}")
        return self.path / "etc/modprobe.d/zz-admin.conf", b"", "1af4:1041"


TEMPLATES: dict[str, Path] = {}


def template(sample: str, factory: pytest.TempPathFactory, variant: str = "") -> Path:
    """Each sample host built once, copied for every file. The ``upstream`` variant is an
    Arch root: upstream's grub-mkconfig (reads /etc/default/grub only), no update-grub."""
    key = f"{sample}:{variant}"
    if key not in TEMPLATES:
        grub = {"boot": {"bootloader": "grub", "initramfs": "dracut"}}
        overrides: dict[str, object] = grub if sample == "two-gpus-one-group" else {}
        if variant == "upstream":
            overrides = {"distro": "arch-grub"}
        TEMPLATES[key] = build(factory.mktemp(sample), sample, overrides)
        # as Debian's and Ubuntu's grub packages ship it (Arch's has none)
        if variant != "upstream":
            (TEMPLATES[key] / "etc/default/grub.d").mkdir(parents=True, exist_ok=True)
    return TEMPLATES[key]


SHAPES: dict[str, Callable[..., Shape]] = {
    "grub-intel": Grub,
    "grub-amd": Grub,
    "cmdline": Cmdline,
    "mkinitcpio": Mkinitcpio,
    "other": Other,
}


@pytest.mark.parametrize(("kind", "name", "origin"), _cases())
def test_realworld_boot_file(
    kind: str,
    name: str,
    origin: str,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if kind == "missing":
        if SETTING == "skip":
            pytest.skip(f"{BOOT} is missing and PASSTHROUGH_REALWORLD=skip: real files NOT tested")
        pytest.fail(f"{BOOT} is missing: the real-world boot tier cannot run (see the module doc)")
    host_kind, _, variant = kind.partition(":")
    sample, opts = HOSTS[host_kind]
    path = tmp_path / "root"
    upstream = "upstream" if variant == "upstream" else ""
    shutil.copytree(template(sample, tmp_path_factory, upstream), path, symlinks=True)
    shape = SHAPES[host_kind](path, tmp_path, BOOT / name, origin, variant)
    shape.place()
    exercise(shape, path, opts, capsys)


def exercise(
    shape: Shape, path: Path, opts: PlanOptions, capsys: pytest.CaptureFixture[str]
) -> bool:
    """Plan, apply, the tool's own reading, an admin's edit, undo byte for byte (True) — or
    the CLI's one-line refusal with nothing written (False). tests/test_collected_boot.py
    runs its cases through it too."""
    before_tree = tree(path)
    before = shape.read()
    root = HostRoot(str(path))
    plan = planned(path, opts, capsys)
    if plan is None:
        return False
    apply(root, plan, plan.record())
    shape.expect(before, shape.read(), plan)
    assert make_plan(root, discover(str(path)), opts)[0].empty
    file, old, word = shape.edit()
    edited = shape.read()
    assert word in edited
    shape.still_ours(edited, plan)
    assert make_plan(root, discover(str(path)), opts)[0].empty
    if old:
        file.write_bytes(old)
    else:
        file.unlink()
    undo(root)
    assert tree(path) == before_tree
    return True
