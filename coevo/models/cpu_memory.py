"""Why a long CPU run's resident memory climbs, and the one setting that stops it.

PyTorch's CPU tensors come from the C library's `malloc`. glibc serves a request above
`M_MMAP_THRESHOLD` (128 KiB at start) with its own `mmap`, which `free` unmaps at once; but
its threshold is *dynamic*: each time an mmapped chunk is freed the threshold rises to that
chunk's size (up to 32 MiB). A sampling loop frees tens-of-MiB tensors every step (the KV
cache grows by concatenation, batch_select_indices copies it, the logits are [rows, vocab]),
so after the first few steps those tensors come from the heap instead, and a heap returns
memory to the system only from its top: freed blocks below a live one stay resident, and the
next batch's slightly larger tensors do not fit in them. Measured on the embedded model
(bench/cpu_memory.py, 72 BFCL simple_python episodes per evaluation): 4.9, 7.9 and 10.6 GB
resident after three evaluations with the dynamic threshold; 1.3 GB after each with a fixed
one, at 0.95x the time. A bench process evaluating a few hundred episodes was OOM-killed at
22.7 GB with other work beside it.

`pin_mmap_threshold()` fixes the threshold with `mallopt`, which also turns the dynamic
adjustment off (glibc's documented behaviour for an explicit setting), so every large tensor
is mmapped and unmapped on free. It is a process-wide setting; it leaves the threshold alone
when the user set one (`MALLOC_MMAP_THRESHOLD_`) and does nothing on a C library other than
glibc. The cost, a page fault per fresh page of a large tensor, did not show in the time.
"""

from __future__ import annotations

import ctypes
import os
import threading

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
DEFAULT_THRESHOLD = 1 << 20  # 1 MiB: small tensors stay on the heap, activations do not

_lock = threading.Lock()
_pinned: int | None = None


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # only glibc has it
        libc.mallopt
    except (OSError, AttributeError):
        return None
    return libc


def pin_mmap_threshold(nbytes: int = DEFAULT_THRESHOLD) -> int | None:
    """Fix glibc's mmap threshold at `nbytes` for this process (see the module docstring).
    Returns the threshold in force when coevo set it, else None (the user's setting, or not
    glibc). Idempotent."""
    global _pinned
    with _lock:
        if _pinned is not None:
            return _pinned
        if os.environ.get("MALLOC_MMAP_THRESHOLD_") is not None:
            return None
        libc = _glibc()
        if libc is None or libc.mallopt(M_MMAP_THRESHOLD, int(nbytes)) != 1:
            return None
        _pinned = int(nbytes)
        return _pinned


def resident_bytes() -> int | None:
    """This process's resident set size (Linux /proc), or None where there is no /proc."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")
