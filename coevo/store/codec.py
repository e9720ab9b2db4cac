"""Compact binary packing of per-token arrays (token ids, loss masks, log-probabilities).

A trajectory carries three arrays of one entry per token. Storing them as JSON lists costs
~5-20 bytes per entry and a parse on every read; one row per token would make a 10,000-episode
round two million rows. Each array is instead one blob: a one-byte format tag, then the
zlib-compressed little-endian array (uint8 mask, float32 logprobs; int32 token ids are written raw, see TAG_IDS_RAW).

The tag makes a blob self-describing: decoding a mask blob as token ids is an error, not
garbage, and a later format (another dtype or compressor) can be read next to this one.

Log-probabilities are stored as float32, the precision the policy computes them in; a float64
value that is not float32-representable is rounded to the nearest float32 (relative error
< 6e-8). Values produced by a float32 model round-trip exactly.

>>> unpack_ids(pack_ids([1, 49151, 0]))
[1, 49151, 0]
>>> unpack_mask(pack_mask([0, 1, 1]))
[0, 1, 1]
>>> unpack_logprobs(pack_logprobs([-0.5, 0.0]))
[-0.5, 0.0]
"""

from __future__ import annotations

import sys
import zlib
from array import array
from collections.abc import Sequence

# One byte in front of the compressed payload; never reuse a value for another format.
TAG_IDS = 0x01  # zlib(int32 little-endian)
TAG_MASK = 0x02  # zlib(uint8)
TAG_LOGPROBS = 0x03  # zlib(float32 little-endian)
TAG_IDS_RAW = 0x04  # int32 little-endian, uncompressed (what pack_ids writes now)

# Level 1: token ids barely compress whatever the level (they are near-random), masks and
# logprobs compress well already at 1, and higher levels cost more CPU on the insert path.
_LEVEL = 1

# The stdlib `array` rather than numpy: for arrays of a few hundred entries the conversion
# from a Python list is 3-5x cheaper, and it range-checks ints on the way in.
_CODES = {TAG_IDS: "i", TAG_MASK: "B", TAG_LOGPROBS: "f", TAG_IDS_RAW: "i"}
_NAMES = {TAG_IDS: "token ids", TAG_MASK: "loss mask", TAG_LOGPROBS: "logprobs",
          TAG_IDS_RAW: "token ids"}
# Token ids are near-random over a large vocabulary: zlib saves about a quarter of their bytes
# but was a sixth of the insert path's CPU, so they are written raw. Blobs written earlier with
# TAG_IDS still decode.
_COMPRESSED = {TAG_IDS, TAG_MASK, TAG_LOGPROBS}
_SWAP = sys.byteorder != "little"  # blobs are little-endian on every machine
assert array("i").itemsize == 4 and array("f").itemsize == 4


class CodecError(ValueError):
    """A value cannot be packed, or a blob is not the kind it is decoded as."""


def _pack(tag: int, values: Sequence, what: str) -> bytes:
    try:
        arr = array(_CODES[tag], values)
    except (OverflowError, TypeError) as e:
        raise CodecError(f"{what}: {e}") from None
    if _SWAP:
        arr.byteswap()
    payload = arr.tobytes()
    return bytes((tag,)) + (zlib.compress(payload, _LEVEL) if tag in _COMPRESSED else payload)


def _unpack(tag: int | tuple[int, ...], blob: bytes | memoryview | None) -> list:
    if blob is None:
        return []
    tags = tag if isinstance(tag, tuple) else (tag,)
    blob = bytes(blob)  # PostgreSQL drivers may hand back a memoryview
    if not blob or blob[0] not in tags:
        found = _NAMES.get(blob[0], f"tag {blob[0]:#04x}") if blob else "an empty blob"
        raise CodecError(f"expected packed {_NAMES[tags[0]]}, found {found}")
    tag = blob[0]
    raw = zlib.decompress(blob[1:]) if tag in _COMPRESSED else blob[1:]
    arr = array(_CODES[tag])
    if len(raw) % arr.itemsize:
        raise CodecError(f"packed {_NAMES[tag]}: {len(raw)} bytes is not a whole number of entries")
    arr.frombytes(raw)
    if _SWAP:
        arr.byteswap()
    return arr.tolist()


def pack_ids(ids: Sequence[int]) -> bytes:
    """Token ids -> blob. Raises CodecError for an id outside int32."""
    return _pack(TAG_IDS_RAW, ids, "token ids must be integers in the int32 range")


def unpack_ids(blob: bytes | memoryview | None) -> list[int]:
    return _unpack((TAG_IDS_RAW, TAG_IDS), blob)


def pack_mask(mask: Sequence[int]) -> bytes:
    """Loss mask -> blob. Entries must be 0 or 1 (1 = sampled by the policy)."""
    if mask and (max(mask) > 1 or min(mask) < 0):
        raise CodecError("loss mask entries must be 0 or 1")
    return _pack(TAG_MASK, mask, "loss mask entries must be 0 or 1")


def unpack_mask(blob: bytes | memoryview | None) -> list[int]:
    return _unpack(TAG_MASK, blob)


def pack_logprobs(logprobs: Sequence[float]) -> bytes:
    """Log-probabilities -> blob (float32; see the module docstring on precision)."""
    return _pack(TAG_LOGPROBS, logprobs, "logprobs must be numbers")


def unpack_logprobs(blob: bytes | memoryview | None) -> list[float]:
    # array("f").tolist() gives Python floats holding the exact float32 values.
    return _unpack(TAG_LOGPROBS, blob)
