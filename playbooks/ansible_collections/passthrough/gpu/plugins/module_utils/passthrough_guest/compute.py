# SPDX-License-Identifier: Apache-2.0
"""Does the GPU really compute? A vector add through the CUDA driver API, nothing else.

Inside a guest the question that matters last is whether the card runs a kernel and
returns the right numbers. This module answers it with the driver's own library
(``libcuda.so.1``, installed with every NVIDIA driver) loaded through :mod:`ctypes`:
the kernel is PTX text below, which the driver JIT-compiles for whatever GPU is there,
so no CUDA toolkit, compiler or Python package is needed. Standard library only — it
runs inside a guest where the ``passthrough`` package is not installed (the Ansible
guest module ships this file as module_utils).

Never raises: every outcome is a :class:`ComputeResult` — ``pass`` (every element
right), ``fail`` (the driver is there but something went wrong, named), or ``skip``
(no driver library to load: nothing could be tried, which is never a pass).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from array import array
from dataclasses import asdict, dataclass
from typing import Any

# PTX ISA 6.0 for sm_50: the oldest target current drivers still JIT from, so the same
# text runs on Maxwell through Hopper and later. c[i] = a[i] + b[i] for i < n.
VECTOR_ADD_PTX = b"""
.version 6.0
.target sm_50
.address_size 64

.visible .entry vadd(
    .param .u64 pa,
    .param .u64 pb,
    .param .u64 pc,
    .param .u32 pn
)
{
    .reg .pred p;
    .reg .b32 r<6>;
    .reg .b64 rd<10>;
    .reg .f32 f<4>;

    ld.param.u64 rd1, [pa];
    ld.param.u64 rd2, [pb];
    ld.param.u64 rd3, [pc];
    ld.param.u32 r1, [pn];
    mov.u32 r2, %ctaid.x;
    mov.u32 r3, %ntid.x;
    mov.u32 r4, %tid.x;
    mad.lo.s32 r5, r2, r3, r4;
    setp.ge.u32 p, r5, r1;
    @p bra DONE;
    cvta.to.global.u64 rd4, rd1;
    cvta.to.global.u64 rd5, rd2;
    cvta.to.global.u64 rd6, rd3;
    mul.wide.u32 rd7, r5, 4;
    add.s64 rd8, rd4, rd7;
    ld.global.f32 f1, [rd8];
    add.s64 rd8, rd5, rd7;
    ld.global.f32 f2, [rd8];
    add.f32 f3, f1, f2;
    add.s64 rd9, rd6, rd7;
    st.global.f32 [rd9], f3;
DONE:
    ret;
}
"""

# Where drivers put the library when the loader's path does not name it (container
# images and some cloud guests keep it under /usr/local/nvidia).
LIBCUDA_CANDIDATES = (
    "libcuda.so.1",
    "/usr/local/nvidia/lib64/libcuda.so.1",
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib64/libcuda.so.1",
    "/usr/lib/aarch64-linux-gnu/libcuda.so.1",
)
BLOCK = 256
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76


@dataclass(frozen=True)
class ComputeResult:
    status: str  # "pass" | "fail" | "skip"
    reason: str
    device_name: str | None = None
    memory_bytes: int | None = None
    elements: int = 0
    elapsed_ms: float | None = None
    driver_version: int | None = None  # CUDA driver API version, e.g. 13000 for 13.0
    compute_capability: str | None = None
    library: str | None = None

    def to_json(self) -> dict[str, object]:
        return asdict(self)


class _CudaError(Exception):
    def __init__(self, call: str, code: int, name: str) -> None:
        super().__init__(f"{call} returned {name} ({code})")


def _load(libcuda: str | None) -> tuple[ctypes.CDLL | None, str]:
    """The driver library, or None and why each place failed."""
    if libcuda:
        try:
            return ctypes.CDLL(libcuda), libcuda
        except OSError as exc:
            return None, str(exc)
    for candidate in LIBCUDA_CANDIDATES:
        try:
            return ctypes.CDLL(candidate), candidate
        except OSError:
            continue
    places = ", ".join(os.path.dirname(c) for c in LIBCUDA_CANDIDATES if "/" in c)
    return None, f"not in the loader's path nor in {places}"


class _Driver:
    """The few driver API calls the probe makes, each checked."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib

    def _name(self, code: int) -> str:
        text = ctypes.c_char_p()
        try:
            if self.lib.cuGetErrorName(code, ctypes.byref(text)) == 0 and text.value:
                return text.value.decode()
        except AttributeError:
            pass
        return "CUDA error"

    def __call__(self, call: str, *args: object) -> None:
        code = getattr(self.lib, call)(*args)
        if code != 0:
            raise _CudaError(call, code, self._name(code))


MAX_ELEMENTS = 1 << 22  # every 3i below 2**24: exact in float32, so the check is exact


def run_vector_add(libcuda: str | None = None, elements: int = 1 << 20) -> ComputeResult:
    """Add two vectors of ``elements`` floats on GPU 0 and check every result."""
    if not 1 <= elements <= MAX_ELEMENTS:
        return ComputeResult("fail", f"elements must be 1..{MAX_ELEMENTS}, not {elements}")
    lib, where = _load(libcuda)
    if lib is None:
        return ComputeResult(
            "skip", f"no NVIDIA driver library to load (libcuda.so.1): {where}", elements=elements
        )
    cu = _Driver(lib)
    facts: dict[str, Any] = {"library": where, "elements": elements}
    try:
        return _run(cu, elements, facts)
    except _CudaError as exc:
        return ComputeResult("fail", str(exc), **facts)
    except (AttributeError, OSError, ValueError) as exc:
        return ComputeResult("fail", f"driver library unusable: {exc}", **facts)


def _run(cu: _Driver, n: int, facts: dict[str, Any]) -> ComputeResult:
    cu("cuInit", 0)
    version = ctypes.c_int()
    cu("cuDriverGetVersion", ctypes.byref(version))
    facts["driver_version"] = version.value
    count = ctypes.c_int()
    cu("cuDeviceGetCount", ctypes.byref(count))
    if count.value < 1:
        return ComputeResult("fail", "the driver sees no CUDA device", **facts)
    device = ctypes.c_int()
    cu("cuDeviceGet", ctypes.byref(device), 0)
    name = ctypes.create_string_buffer(256)
    cu("cuDeviceGetName", name, 256, device)
    facts["device_name"] = name.value.decode(errors="replace")
    memory = ctypes.c_size_t()
    cu("cuDeviceTotalMem_v2", ctypes.byref(memory), device)
    facts["memory_bytes"] = memory.value
    major, minor = ctypes.c_int(), ctypes.c_int()
    cu(
        "cuDeviceGetAttribute",
        ctypes.byref(major),
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        device,
    )
    cu(
        "cuDeviceGetAttribute",
        ctypes.byref(minor),
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        device,
    )
    facts["compute_capability"] = f"{major.value}.{minor.value}"

    # The primary context: the one every runtime-API program shares; retain/release
    # leaves the device as we found it.
    context = ctypes.c_void_p()
    cu("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
    try:
        cu("cuCtxSetCurrent", context)
        return _vector_add(cu, n, facts)
    finally:
        release = getattr(cu.lib, "cuDevicePrimaryCtxRelease_v2", None)
        (release or cu.lib.cuDevicePrimaryCtxRelease)(device)


def _vector_add(cu: _Driver, n: int, facts: dict[str, Any]) -> ComputeResult:
    module = ctypes.c_void_p()
    cu("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(VECTOR_ADD_PTX + b"\0"))
    buffers: list[ctypes.c_uint64] = []
    try:
        kernel = ctypes.c_void_p()
        cu("cuModuleGetFunction", ctypes.byref(kernel), module, b"vadd")
        a = array("f", range(n))
        b = array("f", range(0, 2 * n, 2))
        out = array("f", bytes(4 * n))
        size = ctypes.c_size_t(4 * n)
        for _buffer in range(3):
            ptr = ctypes.c_uint64()
            cu("cuMemAlloc_v2", ctypes.byref(ptr), size)
            buffers.append(ptr)
        for ptr, host in zip(buffers[:2], (a, b), strict=True):
            address, _length = host.buffer_info()
            cu("cuMemcpyHtoD_v2", ptr, ctypes.c_void_p(address), size)
        count = ctypes.c_uint32(n)
        params = (ctypes.c_void_p * 4)(
            *(ctypes.cast(ctypes.byref(x), ctypes.c_void_p) for x in (*buffers, count))
        )
        grid = (n + BLOCK - 1) // BLOCK
        started = time.perf_counter()
        cu("cuLaunchKernel", kernel, grid, 1, 1, BLOCK, 1, 1, 0, None, params, None)
        cu("cuCtxSynchronize")
        elapsed = (time.perf_counter() - started) * 1000
        address, _length = out.buffer_info()
        cu("cuMemcpyDtoH_v2", ctypes.c_void_p(address), buffers[2], size)
    finally:
        for ptr in buffers:
            cu.lib.cuMemFree_v2(ptr)
        cu.lib.cuModuleUnload(module)
    facts["elapsed_ms"] = round(elapsed, 3)
    # a[i] + b[i] = 3i, exact in float32 for i < 2**22.
    wrong = next((i for i in range(n) if out[i] != 3.0 * i), None)
    if wrong is not None:
        return ComputeResult(
            "fail",
            f"vector add gave a wrong result at element {wrong}: {out[wrong]} instead of {3.0 * wrong}",
            **facts,
        )
    return ComputeResult("pass", f"vector add of {n} floats correct on the GPU", **facts)


def main(argv: list[str] | None = None) -> int:
    """``python3 -m passthrough.guest.compute [LIBCUDA]``: the probe alone, as JSON."""
    args = sys.argv[1:] if argv is None else argv
    lib = args[0] if args else os.environ.get("PASSTHROUGH_LIBCUDA")
    result = run_vector_add(lib)
    sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
    return {"pass": 0, "fail": 1}.get(result.status, 0)


if __name__ == "__main__":
    raise SystemExit(main())
