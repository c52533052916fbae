"""Buffers for whole weight versions, with their memory faulted in before they are needed.

Writing 256 MiB into fresh memory on this machine costs 0.3 s, of which 0.25 s is the kernel handing
out 65,536 pages one fault at a time (a VM: every fault exits to the hypervisor); writing into memory
that is already faulted in takes 0.05 s. That fault time would sit inside the window a user waits
for (the learner's serialisation before it can announce; a receiver's CPU while it relays), although
nothing forces it there: the size of the next version is known (it is the size of this one).

`SpareBuffers` keeps one buffer of the expected size ready: `take` hands it out when the size matches
(else a fresh one), and `prepare` faults the next one in on a background thread, between versions
(`madvise(MADV_POPULATE_WRITE)`, one system call, kernel 5.14+; elsewhere the pages fault on first
write, as before). The price is one extra version-sized buffer per process.

A buffer is anonymous memory, or a shared mapping of a file (the learner's spill folder; a vLLM
worker's received checkpoint): a spare file is made under a temporary name in the folder of the file
it will become and renamed on `take` (the mapping stays valid across the rename).
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MADV_POPULATE_WRITE = 23  # linux/mman.h (5.14+); Python 3.11's mmap module does not name it
SPARE_SUFFIX = ".spare"
_LIBC = ctypes.CDLL(None, use_errno=True)


def allocate_buffer(size_bytes: int, path: Path | None = None, *, populate: bool = False) -> memoryview:
    """A writable buffer of `size_bytes`: a shared mapping of a new file at `path`, or anonymous memory.
    `populate`: fault every page in now (else on first write). Zero bytes: an empty bytearray (mmap
    refuses size 0)."""
    if size_bytes == 0:
        return memoryview(bytearray())
    if path is None:
        mapping = mmap.mmap(-1, size_bytes)
    else:
        with path.open("w+b") as out:
            out.truncate(size_bytes)
            mapping = mmap.mmap(out.fileno(), size_bytes, access=mmap.ACCESS_WRITE)
    if populate:
        populate_pages(mapping)
    return memoryview(mapping)


def populate_pages(mapping: mmap.mmap) -> None:
    """Fault every page of a writable mapping in, with one madvise call made through ctypes, which lets
    go of the GIL (mmap.madvise holds it: 0.25 s for 256 MiB during which no other thread of the
    process runs). On a kernel without MADV_POPULATE_WRITE the pages fault on first write instead."""
    anchor = ctypes.c_char.from_buffer(mapping)  # the mapping's address; released before returning
    try:
        address = ctypes.addressof(anchor)
        if _LIBC.madvise(ctypes.c_void_p(address), ctypes.c_size_t(len(mapping)), MADV_POPULATE_WRITE) != 0:
            log.debug("MADV_POPULATE_WRITE failed (errno %d): pages fault on first write", ctypes.get_errno())
    finally:
        del anchor


def map_file(path: Path, writable: bool = False) -> memoryview:
    """The whole file as a memoryview of a shared mapping (read-only unless `writable`)."""
    with path.open("r+b" if writable else "rb") as mapped_file:
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        return memoryview(mmap.mmap(mapped_file.fileno(), 0, access=access))


@dataclass
class _Spare:
    size_bytes: int
    folder: Path | None  # None: anonymous memory
    buffer: memoryview
    path: Path | None


class SpareBuffers:
    """One pre-faulted buffer for the next version of the expected size (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spare: _Spare | None = None
        self._preparing: threading.Thread | None = None
        self.num_taken_spare = 0
        self.num_allocated = 0

    def take(self, size_bytes: int, path: Path | None = None) -> memoryview:
        """A writable buffer of `size_bytes` (at `path` when given): the spare if it fits, else new."""
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None and spare.size_bytes == size_bytes and spare.folder == (path.parent if path else None):
            if path is not None and spare.path is not None:
                os.replace(spare.path, path)
            self.num_taken_spare += 1
            return spare.buffer
        if spare is not None and spare.path is not None:
            spare.path.unlink(missing_ok=True)
        self.num_allocated += 1
        return allocate_buffer(size_bytes, path)

    def prepare(self, size_bytes: int, folder: Path | None = None) -> None:
        """Fault in a spare of `size_bytes` (a file in `folder`, or anonymous memory) on a background
        thread; a spare already there of that shape is kept."""
        if size_bytes == 0:
            return
        with self._lock:
            spare = self._spare
            if spare is not None and (spare.size_bytes, spare.folder) == (size_bytes, folder):
                return
            if self._preparing is not None and self._preparing.is_alive():
                return
            self._preparing = threading.Thread(
                target=self._prepare, args=(size_bytes, folder), name="spare-buffer", daemon=True
            )
            self._preparing.start()

    def wait(self, timeout_s: float | None = None) -> None:
        """Until the spare being prepared is ready (tests, benchmarks)."""
        thread = self._preparing
        if thread is not None:
            thread.join(timeout_s)

    def discard(self) -> None:
        """Drop the spare (and its file), after any being prepared: at shutdown nothing is left behind."""
        self.wait(timeout_s=30.0)
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None and spare.path is not None:
            spare.path.unlink(missing_ok=True)

    def _prepare(self, size_bytes: int, folder: Path | None) -> None:
        path = folder / f"{os.getpid()}-{threading.get_ident()}{SPARE_SUFFIX}" if folder is not None else None
        try:
            buffer = allocate_buffer(size_bytes, path, populate=True)
        except OSError as exc:
            log.warning("no spare buffer of %d bytes: %s", size_bytes, exc)
            return
        with self._lock:
            old, self._spare = self._spare, _Spare(size_bytes, folder, buffer, path)
        if old is not None and old.path is not None:
            old.path.unlink(missing_ok=True)
