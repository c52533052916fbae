"""A chunk holder that lies: it serves one chunk with a bit flipped (bad memory, a bad disk, a malicious
relay), for tests of verification and of routing around a bad source."""

from __future__ import annotations

from shared.weight_channel import ChunkStore


class CorruptingStore(ChunkStore):
    """A ChunkStore (its chunks were verified on the way in) that serves chunk `corrupt_index` with its
    first bit flipped while `corrupt` is set."""

    def __init__(self, corrupt_index: int, *, corrupt: bool = True) -> None:
        super().__init__()
        self.corrupt_index = corrupt_index
        self.corrupt = corrupt

    def get_chunk(self, policy_version: int, index: int, wait_s: float = 0.0, **artifact: str | None) -> bytes | None:
        chunk = super().get_chunk(policy_version, index, wait_s, **artifact)
        if self.corrupt and chunk is not None and index == self.corrupt_index:
            return bytes([chunk[0] ^ 1]) + chunk[1:]
        return chunk
