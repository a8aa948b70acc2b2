#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One command per job on a fresh Debian 12 machine (README "Quick start"):
#   bash scripts/setup.sh demo   install what passthrough needs, then run the main job
#                                 (check + scan) on a bundled sample host
#   bash scripts/setup.sh test   install what the test suite needs, then run all of it
#   bash scripts/setup.sh lab    install what the lab needs, then run its whole chain on a
#                                 real kernel under QEMU (as root; docs/lab.md)
#   bash scripts/setup.sh bootstacks
#                                 install what the tests need, then the full runs over SSH of
#                                 the other boot stacks (dracut, systemd-boot, upstream GRUB),
#                                 which the test mode has as boot checks only (tens of minutes
#                                 each; docs/testing.md)
#   bash scripts/setup.sh modernvfio
#                                 install what the tests need, then boot a current kernel on a
#                                 Debian sid userland and prove iommufd, the vfio cdev, check's
#                                 PASS and a live release/bind there (lab/modern.py, tens of
#                                 minutes under TCG; left out of the test mode: docs/lab.md)
# Safe to re-run: apt and pip skip what is already there.
set -euo pipefail

mode="${1:-demo}"
case "$mode" in demo|test|lab|bootstacks|modernvfio) ;; *) echo "usage: $0 demo|test|lab|bootstacks|modernvfio" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# System packages: a compiler, pkg-config and libvirt's headers build libvirt-python, the
# extra passthrough[libvirt] that `vm` and `validate --connect` need (PyPI ships no wheels for
# it; the other commands need no compiler: README "Install"); libudev is what pyudev loads.
packages=(python3 python3-venv python3-dev gcc pkg-config libvirt-dev libudev1 libvirt-clients)
if [ "$mode" != demo ]; then
    # umockdev: recorded devices for the pyudev tests; pciutils: lspci cross-checks
    # fixtures and is the benchmark's reference.
    # gir1.2-umockdev-1.0 + the headers PyGObject builds against: a UMockdev test bed
    # that emits bind/unbind uevents; debootstrap: the chroot apply/undo test.
    packages+=(umockdev gir1.2-umockdev-1.0 libgirepository1.0-dev libcairo2-dev pciutils bash debootstrap)
    # initramfs-tools-core + cpio: lsinitramfs lists real initramfs images (the check of
    # what the next boot gets, tests/test_nextboot.py)
    packages+=(initramfs-tools-core cpio)
    # strace: the fault harness kills apply at real syscalls (inject=…:signal=KILL)
    packages+=(strace)
    # kmod: modprobe -c reads real modprobe.d files the way boot does (realworld boot tier)
    packages+=(kmod)
    # libvirt-clients + libxml2-utils: virt-xml-validate and the RelaxNG schemas; a real
    # libvirtd with the QEMU driver and OVMF for the domain tests.
    # (procps: scripts/libvirtd-up.sh asks pgrep whether virtlogd really runs)
    packages+=(libvirt-clients libxml2-utils libvirt-daemon libvirt-daemon-driver-qemu qemu-system-x86 ovmf qemu-utils procps)
    # the lab: an ext4 image straight from a directory, SSH into the lab machine
    packages+=(e2fsprogs openssh-client grub-efi-amd64-bin grub-common dosfstools mtools fdisk)
    # the guests a user installs (tests/test_guest_install.py): swtpm for the emulated TPM 2.0,
    # virt-install to compare the Windows 11 domain with, Debian's netboot installer (its
    # kernel and initrd on an ISO that grub-mkrescue builds, xorriso under it)
    packages+=(swtpm swtpm-tools virtinst debian-installer-12-netboot-amd64 xorriso)
    # sudo: the playbooks' become (tests/test_ansible.py runs them as Ansible users do)
    packages+=(sudo)
    # openssh-server + iproute2: a throwaway SSH host in a network namespace
    # (benchmarks/sshfleet.py; tests/test_hosttask.py reaches it as a fleet host over SSH)
    packages+=(openssh-server iproute2)
fi
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "==> installing system packages: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ "$mode" = test ]; then
    # libvirt's own test domains (tests/qemuxml*data of Debian 12's libvirt source package),
    # read by tests/test_libvirt_corpus.py from the test cache, outside the repository; and
    # its memlock test (tests/qemumemlock*), read by tests/test_memlock_libvirt.py.
    corpus="${PASSTHROUGH_TEST_CACHE:-/var/cache/passthrough-test}/libvirt-src"
    if ! ls "$corpus"/libvirt_*.orig.tar.xz >/dev/null 2>&1; then
        echo "==> fetching libvirt's test domains (apt-get source libvirt, bookworm) into $corpus"
        debsrc=/etc/apt/sources.list.d/passthrough-deb-src.sources
        if [ ! -f "$debsrc" ]; then
            printf '%s\n' "Types: deb-src" "URIs: http://deb.debian.org/debian" "Suites: bookworm" \
                "Components: main" "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" |
                $SUDO tee "$debsrc" >/dev/null
        fi
        $SUDO apt-get update -qq
        $SUDO mkdir -p "$corpus"
        (cd "$corpus" && $SUDO apt-get source -qq --download-only libvirt/bookworm)
    fi
    if ! ls -d "$corpus"/libvirt-*/tests/qemuxml2xmloutdata >/dev/null 2>&1; then
        $SUDO tar -xJf "$corpus"/libvirt_*.orig.tar.xz -C "$corpus" --wildcards '*/tests/qemuxml*data/*'
    fi
    if ! ls "$corpus"/libvirt-*/tests/qemumemlocktest.c >/dev/null 2>&1; then
        $SUDO tar -xJf "$corpus"/libvirt_*.orig.tar.xz -C "$corpus" --wildcards '*/tests/qemumemlock*'
    fi
    # libvirt's RelaxNG schemas from a release that knows <driver iommufd='yes'/> (12.1+; Debian
    # 12's 9.0 does not): Debian sid's libvirt-common (225 kB), fetched and signature-checked by
    # apt from a private source list, unpacked into the test cache; tests/test_iommufd_schema.py
    schemas="${PASSTHROUGH_TEST_CACHE:-/var/cache/passthrough-test}/libvirt-schemas"
    if ! ls "$schemas"/usr/share/libvirt/schemas/domain.rng >/dev/null 2>&1; then
        echo "==> fetching libvirt's schemas (libvirt-common, Debian sid) into $schemas"
        sid=(-o Dir::Etc::SourceList="$schemas/apt/sid.list" -o Dir::Etc::SourceParts=/dev/null
            -o Dir::State::Lists="$schemas/apt/lists" -o Dir::Cache="$schemas/apt/cache"
            -o Acquire::Languages=none)
        $SUDO mkdir -p "$schemas/apt/lists/partial" "$schemas/apt/cache/archives/partial"
        echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main" |
            $SUDO tee "$schemas/apt/sid.list" >/dev/null
        $SUDO apt-get "${sid[@]}" update -qq
        (cd "$schemas" && $SUDO apt-get "${sid[@]}" download -qq libvirt-common)
        $SUDO dpkg-deb -x "$schemas"/libvirt-common_*.deb "$schemas"
        $SUDO rm -rf "$schemas/apt"
    fi
fi

if [ ! -x .venv/bin/python ]; then
    echo "==> creating .venv"
    python3 -m venv .venv
fi
# the demo ends with `vm define` (libvirt's test driver): the extra [libvirt]; [test] holds it
# too (the tests' own install without it: tests/test_install_without_libvirt.py)
extra="[libvirt]"
[ "$mode" = test ] && extra="[test]"
echo "==> installing passthrough${extra} into .venv"
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# compat: a plain path entry in a .pth, not setuptools' default import hook, which costs
# every python start in the venv about 20 ms (it imports pathlib, inspect, importlib.util)
.venv/bin/python -m pip install -q -e ".${extra}" --config-settings editable_mode=compat

if [ "$mode" = demo ]; then
    # The whole chain on a bundled sample host; nothing on this machine is changed.
    sample="${PASSTHROUGH_SAMPLE:-hgx-h100}"
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    root="$work/$sample"
    pt=.venv/bin/passthrough
    $pt sample build "$sample" "$root"
    echo
    echo "==> 1. passthrough check --root <$sample>"
    $pt check --root "$root" || true
    echo
    echo "==> 2. passthrough scan --root <$sample> --gpus-only --topology"
    $pt scan --root "$root" --gpus-only --topology
    echo
    echo "==> 3. passthrough plan --root <$sample>   (diffs only: nothing is written)"
    $pt plan --root "$root"
    echo
    echo "==> 4. passthrough render --root <$sample> --name gpu-vm --gpu 0000:18:00.0 --gpu 0000:19:00.0"
    $pt render --root "$root" --name gpu-vm --gpu 0000:18:00.0 --gpu 0000:19:00.0 --vcpus 8 --memory 64G -o "$work/gpu-vm.xml"
    sed -n '/<hostdev/,/<\/hostdev>/p' "$work/gpu-vm.xml" | head -8
    echo
    echo "==> 5. passthrough validate --host-root <$sample> --connect test:///default gpu-vm.xml"
    $pt validate --host-root "$root" --connect test:///default "$work/gpu-vm.xml"
    echo
    echo "==> 6. passthrough vm define gpu-vm.xml --start --connect test:///default   (libvirt's built-in test driver)"
    $pt vm define "$work/gpu-vm.xml" --start --connect test:///default
    echo
    echo "==> next, on a real host (as root):"
    echo "    $pt check && $pt scan            # is this host ready, which cards can go"
    echo "    $pt plan && $pt apply            # kernel arguments + vfio-pci, then reboot"
    echo "    $pt verify                       # after the reboot"
    echo "    $pt render --name gpu-vm -o gpu-vm.xml && $pt vm define gpu-vm.xml --start"
    exit 0
fi

if [ "$mode" = lab ]; then
    exec .venv/bin/python lab/run.py --full
fi
if [ "$mode" = bootstacks ]; then
    exec .venv/bin/python -m pytest -q -m bootstacks
fi
if [ "$mode" = modernvfio ]; then
    exec .venv/bin/python -m pytest -q -m modernvfio
fi

# The lab tier (a real kernel under QEMU, TCG) starts first, in a process of its own beside
# everything else: its guests spend most of their time on one CPU and in boots and SSH waits,
# while the rest of the suite needs the other. Side by side on the 2-core CI machine the
# whole run takes the lab's time plus a little, not the sum of both (docs/testing.md).
lab_log="$(mktemp -t passthrough-lab-tier.XXXXXX.log)"
# While the lab's nested guest boots (TCG inside TCG: three- to fourfold slower beside any
# busy thread, even at nice 19) the lab holds this file, and the tests beside it start no new
# test until it goes (tests/conftest.py wait_for_the_lab; each wait logged beside it)
PASSTHROUGH_LAB_ALONE="$(mktemp -u -t passthrough-lab-alone.XXXXXX)"
export PASSTHROUGH_LAB_ALONE
echo "==> pytest, lab tier (beside the rest; its log: $lab_log, printed at the end)"
# (the boot checks, tests/lab/test_boot_check.py, run in this process after the rest, below)
.venv/bin/python -m pytest -q -p no:cacheprovider -m "lab and not bootstacks and not modernvfio" \
    --ignore tests/lab/test_boot_check.py >"$lab_log" 2>&1 &
lab_pid=$!
trap 'kill "$lab_pid" 2>/dev/null || true' EXIT INT TERM

status=0
echo "==> ruff"
.venv/bin/ruff check passthrough tests benchmarks playbooks/ansible_collections/passthrough/gpu/plugins lab || status=1
.venv/bin/ruff format --check passthrough tests benchmarks playbooks/ansible_collections/passthrough/gpu/plugins lab || status=1
echo "==> mypy (strict)"
.venv/bin/mypy || status=1
# Every tier but two: the boot stacks' full runs over SSH (dracut, systemd-boot, upstream
# GRUB: apply inside the booted host, reboots; 10-27 minutes each under TCG) and the current
# kernel's iommufd stage take CI's run past its hour beside the rest; `bash scripts/setup.sh
# bootstacks` and `bash scripts/setup.sh modernvfio` run them. Each of those boot stacks is
# booted below all the same, in its boot check.
echo "==> pytest, every other tier but bootstacks and modernvfio (a bare pytest runs the quick tier only)"
.venv/bin/python -m pytest -q -m "not lab and not bootstacks and not modernvfio" || status=1
# The boot check of each stack (dracut, systemd-boot, upstream GRUB: apply/undo --root natively,
# one boot per state to a checking init, no SSH; about 10 min for the three alone) in this
# process once the rest is done, beside the lab tier's last stages (docs/testing.md)
echo "==> pytest, the boot stacks' boot checks (lab/bootcheck.py, $(date -u +%H:%M:%S))"
.venv/bin/python -m pytest -q -p no:cacheprovider -m lab tests/lab/test_boot_check.py || status=1
echo "==> waiting for the lab tier ($(date -u +%H:%M:%S))"
lab_status=0
wait "$lab_pid" || lab_status=$?
trap - EXIT INT TERM
echo "==> pytest, lab tier: exit $lab_status ($(date -u +%H:%M:%S))"
cat "$lab_log"
rm -f "$lab_log"
if [ -f "$PASSTHROUGH_LAB_ALONE.log" ]; then
    echo "==> the tests beside the lab waited for its nested guest:"
    cat "$PASSTHROUGH_LAB_ALONE.log"
fi
rm -f "$PASSTHROUGH_LAB_ALONE" "$PASSTHROUGH_LAB_ALONE.log"
[ "$lab_status" -eq 0 ] || status=1
exit "$status"
