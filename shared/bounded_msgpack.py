"""Bounded msgpack decoding for payloads an untrusted sender wrote (a rollout worker's submissions).

`msgpack.unpackb` builds every object a payload describes before anything can check it: one byte is an
empty map, so 16 MiB can be ~16.7M dicts (~1.2 GiB and seconds of CPU before the message is refused).
Its `max_*_len` options bound one container or string at a time, not how many there are nor how deep they
nest. `unpack_bounded` walks the payload itself instead: it reads each container's header and checks it
against `DecodeLimits` (depth, length, and the items of the whole payload) before building anything, and
hands only scalars to msgpack, one at a time, after checking their size. What a payload can cost is then
bounded by its limits, whatever its bytes say, and the refusal names the limit it broke.

The payload is read in place (a memoryview): no copy of it is made, only of the scalars decoded.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

# msgpack's first byte of each kind (https://github.com/msgpack/msgpack/blob/master/spec.md#formats)
_FIXED_SIZES = {
    0xC0: 1,  # nil
    0xC2: 1,  # false
    0xC3: 1,  # true
    0xCA: 5,  # float 32
    0xCB: 9,  # float 64
    0xCC: 2,  # uint 8
    0xCD: 3,  # uint 16
    0xCE: 5,  # uint 32
    0xCF: 9,  # uint 64
    0xD0: 2,  # int 8
    0xD1: 3,  # int 16
    0xD2: 5,  # int 32
    0xD3: 9,  # int 64
}
_STR_LENGTH_BYTES = {0xD9: 1, 0xDA: 2, 0xDB: 4}  # str 8/16/32: the length's width
_BIN_LENGTH_BYTES = {0xC4: 1, 0xC5: 2, 0xC6: 4}  # bin 8/16/32
_ARRAY_LENGTH_BYTES = {0xDC: 2, 0xDD: 4}  # array 16/32 (fixarray: 0x90-0x9f)
_MAP_LENGTH_BYTES = {0xDE: 2, 0xDF: 4}  # map 16/32 (fixmap: 0x80-0x8f)


Payload = bytes | bytearray | memoryview


class DecodeLimitError(ValueError):
    """A payload that breaks one of its DecodeLimits, or is not msgpack; the message says which and where."""


@dataclass(frozen=True)
class DecodeLimits:
    """What one payload may hold. A message type's limits follow from its schema (how deep its fields nest,
    how many it has) and from the run (how many samples and tokens a group has): shared/rollout_limits.py,
    shared/work_api.py."""

    max_depth: int  # containers inside containers: 1 is a map of scalars, 2 a map holding lists of scalars
    max_items: int  # array items and map entries of the whole payload, nested ones included
    max_array_len: int
    max_map_len: int
    max_str_bytes: int  # one string, UTF-8
    max_bin_bytes: int  # one bin

    def describe(self) -> str:
        return (
            f"depth <= {self.max_depth}, <= {self.max_items} items in all, arrays <= {self.max_array_len}, "
            f"maps <= {self.max_map_len}, strings <= {self.max_str_bytes} bytes, bins <= {self.max_bin_bytes} bytes"
        )


def unpack_bounded(payload: Payload, limits: DecodeLimits) -> object:
    """The one object `payload` holds, decoded within `limits` (map keys must be strings; no ext types).
    Raises DecodeLimitError naming the limit broken, or saying why it is not msgpack, before building
    anything the limits do not allow."""
    # the views are released however this ends: a refusal's traceback holds no export of `payload`, whose
    # owner may unmap it (services/coordinator/body_limit.py received_body)
    with memoryview(payload) as view, view.cast("B") as data:
        reader = _Reader(data, limits)
        value = reader.read(depth=0)
        if reader.offset != len(data):
            raise DecodeLimitError(f"{len(data) - reader.offset} bytes after the payload's one object")
        return value


class _Reader:
    def __init__(self, data: memoryview, limits: DecodeLimits) -> None:
        self.data = data
        self.limits = limits
        self.offset = 0
        self.num_items = 0

    def read(self, depth: int) -> object:
        kind = self._byte(self.offset)
        if _is_array(kind):
            length = self._container_length(
                kind, 0x90, _ARRAY_LENGTH_BYTES, depth, "an array", self.limits.max_array_len
            )
            return [self.read(depth + 1) for _ in range(length)]
        if _is_map(kind):
            length = self._container_length(kind, 0x80, _MAP_LENGTH_BYTES, depth, "a map", self.limits.max_map_len)
            entries: dict[str, object] = {}
            for _ in range(length):
                key_kind = self._byte(self.offset)
                if _is_array(key_kind) or _is_map(key_kind):  # refused before it is built
                    raise DecodeLimitError(f"a map key at offset {self.offset} is a container, not a string")
                key = self._scalar(key_kind)
                if not isinstance(key, str):
                    raise DecodeLimitError(f"a map key is a {type(key).__name__}, not a string")
                entries[key] = self.read(depth + 1)
            return entries
        return self._scalar(kind)

    def _container_length(
        self, kind: int, fixed_base: int, widths: dict[int, int], depth: int, name: str, max_length: int
    ) -> int:
        if depth >= self.limits.max_depth:
            raise DecodeLimitError(f"containers nested deeper than {self.limits.max_depth} (the decode limit)")
        if kind in widths:
            length, header = self._length(widths[kind]), 1 + widths[kind]
        else:
            length, header = kind - fixed_base, 1
        if length > max_length:
            raise DecodeLimitError(f"{name} of {length} entries, over the decode limit of {max_length}")
        self.num_items += length
        if self.num_items > self.limits.max_items:
            raise DecodeLimitError(f"over {self.limits.max_items} items in all (the decode limit)")
        self.offset += header
        return length

    def _scalar(self, kind: int) -> object:
        if kind in _FIXED_SIZES:
            size = _FIXED_SIZES[kind]
        elif kind <= 0x7F or kind >= 0xE0:  # positive and negative fixint
            size = 1
        elif 0xA0 <= kind <= 0xBF or kind in _STR_LENGTH_BYTES:
            width = _STR_LENGTH_BYTES.get(kind, 0)
            length = kind - 0xA0 if width == 0 else self._length(width)
            if length > self.limits.max_str_bytes:
                raise DecodeLimitError(
                    f"a string of {length} bytes, over the decode limit of {self.limits.max_str_bytes}"
                )
            size = 1 + width + length
        elif kind in _BIN_LENGTH_BYTES:
            width = _BIN_LENGTH_BYTES[kind]
            length = self._length(width)
            if length > self.limits.max_bin_bytes:
                raise DecodeLimitError(f"a bin of {length} bytes, over the decode limit of {self.limits.max_bin_bytes}")
            size = 1 + width + length
        else:  # ext types (0xc7-0xc9, 0xd4-0xd8) are in no message; 0xc1 is never used
            raise DecodeLimitError(f"byte 0x{kind:02x} at offset {self.offset} starts no value a message holds")
        end = self.offset + size
        if end > len(self.data):
            raise DecodeLimitError(f"the payload ends inside a value ({len(self.data)} bytes, {end} needed)")
        try:
            value = msgpack.unpackb(self.data[self.offset : end], raw=False)
        except ValueError as exc:  # a string that is not UTF-8
            raise DecodeLimitError(f"the value at offset {self.offset} is not valid msgpack ({exc})") from exc
        self.offset = end
        return value

    def _length(self, width: int) -> int:
        start = self.offset + 1
        if start + width > len(self.data):
            raise DecodeLimitError(f"the payload ends inside a header ({len(self.data)} bytes)")
        return int.from_bytes(self.data[start : start + width], "big")

    def _byte(self, offset: int) -> int:
        if offset >= len(self.data):
            raise DecodeLimitError(f"the payload ends where a value should start ({len(self.data)} bytes)")
        return self.data[offset]


def _is_array(kind: int) -> bool:
    return 0x90 <= kind <= 0x9F or kind in _ARRAY_LENGTH_BYTES


def _is_map(kind: int) -> bool:
    return 0x80 <= kind <= 0x8F or kind in _MAP_LENGTH_BYTES
