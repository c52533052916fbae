"""The Redis Streams bus: typed publish, consumer-group reads, ack-after-effect, claiming, dead letters.

Delivery contract (DESIGN.md section 4):
- A consumer reads with XREADGROUP and acknowledges an entry only after its effect is durable (the
  entry it produced is in Redis, or the training step that used it is checkpointed).
- A consumer that dies leaves its entries pending; any other consumer of the group takes them over
  with `claim_stale` (XAUTOCLAIM) once they have been idle for `min_idle_ms`.
- An entry that cannot be decoded, or that has been delivered more than `max_deliveries` times
  (it keeps killing its consumers), goes to the dead-letter stream with the error and is acked in
  the same transaction, so it is neither lost nor retried forever, and the service keeps running.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Generic, TypeVar

import redis

from shared.messages import DeadLetter, Message, MessageDecodeError

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)

PAYLOAD_FIELD = b"data"


@dataclass(frozen=True)
class Delivery(Generic[M]):
    """One decoded stream entry handed to a consumer; ack it once its effect is durable."""

    stream: str
    group: str
    message_id: str
    message: M
    num_deliveries: int


def connect(redis_url: str, socket_timeout_s: float = 30.0) -> redis.Redis:
    """A bytes-mode client. BLOCK timeouts used by the bus stay well below `socket_timeout_s`."""
    return redis.Redis.from_url(redis_url, socket_timeout=socket_timeout_s, decode_responses=False)


class StreamBus:
    def __init__(
        self,
        client: redis.Redis,
        *,
        run_id: str,
        dead_letter_stream: str,
        service: str,
        max_deliveries: int = 3,
    ) -> None:
        self.redis = client
        self.run_id = run_id
        self.dead_letter_stream = dead_letter_stream
        self.service = service
        self.max_deliveries = max_deliveries

    # producing
    def publish(self, stream: str, message: Message, *, maxlen: int | None = None) -> str:
        """XADD one message; returns its entry id. `maxlen` trims approximately (only for streams
        without consumer groups: trimming drops entries nobody has read)."""
        entry_id = self.redis.xadd(stream, {PAYLOAD_FIELD: message.encode()}, maxlen=maxlen, approximate=True)
        return entry_id.decode()

    def publish_and_ack(self, stream: str, messages: list[Message], done: list[Delivery[Message]]) -> None:
        """XADD `messages` to `stream` and XACK the deliveries they were made from, in one MULTI/EXEC:
        a lost connection or a crash never leaves results without acks, nor acks without results
        (AOF logs the transaction as a unit). One round trip for the whole batch."""
        with self.redis.pipeline(transaction=True) as pipe:
            for message in messages:
                pipe.xadd(stream, {PAYLOAD_FIELD: message.encode()})
            for delivery in done:
                pipe.xack(delivery.stream, delivery.group, delivery.message_id)
            pipe.execute()

    def publish_raw(self, stream: str, payload: bytes) -> str:
        """XADD bytes as they are. For tests and tools that need to inject malformed payloads."""
        return self.redis.xadd(stream, {PAYLOAD_FIELD: payload}).decode()

    # consuming
    def ensure_group(self, stream: str, group: str, start_id: str = "0") -> None:
        """Create the consumer group (and the stream) if missing. start_id "0": a new group sees
        everything already in the stream, so nothing produced before a consumer started is lost."""
        try:
            self.redis.xgroup_create(stream, group, id=start_id, mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def read(
        self, stream: str, group: str, consumer: str, message_type: type[M], *, count: int = 1, block_ms: int = 1000
    ) -> list[Delivery[M]]:
        """New entries for this consumer (XREADGROUP >). Undecodable entries are dead-lettered, not returned."""
        response = self.redis.xreadgroup(group, consumer, {stream: ">"}, count=count, block=block_ms)
        return self._decode_entries(stream, group, message_type, _entries_of(response), deliveries={})

    def read_own_pending(
        self, stream: str, group: str, consumer: str, message_type: type[M], *, count: int = 100
    ) -> list[Delivery[M]]:
        """Entries delivered to this consumer name but never acked (XREADGROUP 0): what a restarted
        consumer with the same name must finish first."""
        response = self.redis.xreadgroup(group, consumer, {stream: "0"}, count=count)
        entries = _entries_of(response)
        deliveries = self._delivery_counts(stream, group, [entry_id for entry_id, _ in entries])
        return self._decode_entries(stream, group, message_type, entries, deliveries)

    def claim_stale(
        self, stream: str, group: str, consumer: str, message_type: type[M], *, min_idle_ms: int, count: int = 10
    ) -> list[Delivery[M]]:
        """Take over entries another consumer left pending for `min_idle_ms` (XAUTOCLAIM). Entries
        delivered more than `max_deliveries` times are dead-lettered instead of handed out again."""
        response = self.redis.xautoclaim(
            stream, group, consumer, min_idle_time=min_idle_ms, start_id="0-0", count=count
        )
        entries = [(entry_id, fields) for entry_id, fields in response[1] if fields is not None]
        deliveries = self._delivery_counts(stream, group, [entry_id for entry_id, _ in entries])
        return self._decode_entries(stream, group, message_type, entries, deliveries)

    def ack(self, stream: str, group: str, message_ids: list[str]) -> int:
        if not message_ids:
            return 0
        return int(self.redis.xack(stream, group, *message_ids))

    def dead_letter(self, delivery: Delivery[Message], error: str) -> None:
        """Move a decoded entry whose processing failed to the dead-letter stream (and ack it)."""
        self._dead_letter_raw(
            delivery.stream,
            delivery.group,
            delivery.message_id,
            delivery.message.encode(),
            error,
            delivery.num_deliveries,
        )

    # inspecting
    def group_progress(self, stream: str, group: str) -> tuple[int, int]:
        """(lag, pending) of a group: entries never delivered to it, and delivered but not acked."""
        try:
            groups = self.redis.xinfo_groups(stream)
        except redis.ResponseError:  # no such stream yet
            return 0, 0
        for info in groups:
            if _text(info.get("name")) == group:
                lag = info.get("lag")
                if lag is None:  # Redis cannot tell after some trims: count conservatively
                    lag = self.redis.xlen(stream)
                return int(lag), int(info.get("pending") or 0)
        return int(self.redis.xlen(stream)), 0

    def backlog(self, stream: str, group: str) -> int:
        """Entries of `stream` the group has not finished: never delivered (lag) plus pending."""
        lag, pending = self.group_progress(stream, group)
        return lag + pending

    def length(self, stream: str) -> int:
        return int(self.redis.xlen(stream))

    def dead_letters(self, count: int = 100) -> list[DeadLetter]:
        return [
            DeadLetter.decode(fields[PAYLOAD_FIELD])
            for _, fields in self.redis.xrange(self.dead_letter_stream, count=count)
        ]

    # helpers
    def _decode_entries(
        self,
        stream: str,
        group: str,
        message_type: type[M],
        entries: list[tuple[bytes, dict[bytes, bytes]]],
        deliveries: dict[str, int],
    ) -> list[Delivery[M]]:
        decoded: list[Delivery[M]] = []
        for raw_id, fields in entries:
            entry_id = _text(raw_id)
            payload = fields.get(PAYLOAD_FIELD, b"")
            num_deliveries = deliveries.get(entry_id, 1)
            if num_deliveries > self.max_deliveries:
                self._dead_letter_raw(
                    stream, group, entry_id, payload, f"delivered {num_deliveries} times without ack", num_deliveries
                )
                continue
            try:
                message = message_type.decode(payload)
            except MessageDecodeError as exc:
                self._dead_letter_raw(stream, group, entry_id, payload, str(exc), num_deliveries)
                continue
            decoded.append(Delivery(stream, group, entry_id, message, num_deliveries))
        return decoded

    def _delivery_counts(self, stream: str, group: str, entry_ids: list[bytes]) -> dict[str, int]:
        counts: dict[str, int] = {}
        for entry_id in entry_ids:
            for info in self.redis.xpending_range(stream, group, min=entry_id, max=entry_id, count=1):
                counts[_text(entry_id)] = int(info["times_delivered"])
        return counts

    def _dead_letter_raw(
        self, stream: str, group: str, entry_id: str, payload: bytes, error: str, num_deliveries: int
    ) -> None:
        letter = DeadLetter(
            run_id=self.run_id,
            source_stream=stream,
            source_message_id=entry_id,
            consumer_group=group,
            service=self.service,
            error=error[:4000],
            payload=payload,
            num_deliveries=num_deliveries,
        )
        log.warning("dead-letter %s %s: %s", stream, entry_id, error[:300])
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.xadd(self.dead_letter_stream, {PAYLOAD_FIELD: letter.encode()})
            pipe.xack(stream, group, entry_id)
            pipe.execute()


def _entries_of(response: object) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """XREADGROUP answers [[stream, [(id, fields), ...]]] (RESP2) or {stream: [[...]]} (RESP3)."""
    if not response:
        return []
    if isinstance(response, dict):
        streams = [entries[0] if entries and isinstance(entries[0], list) else entries for entries in response.values()]
    else:
        streams = [entries for _, entries in response]
    return [(entry_id, fields) for entries in streams for entry_id, fields in entries if fields is not None]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
