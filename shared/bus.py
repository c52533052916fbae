"""The Redis Streams bus: typed publish, consumer-group reads, ack-after-effect, claiming, dead letters,
plus plain reads of group-less streams and typed state keys. Every operation takes a descriptor from
shared/streams.py, so the stream's name, group and message type come from one place.

Delivery contract (docs/design.md, "Streams and messages"):
- A consumer reads with XREADGROUP and acknowledges an entry only after its effect is durable (the
  entry it produced is in Redis, or the training step that used it is checkpointed).
- A consumer that dies leaves its entries pending; any other consumer of the group takes them over
  with `claim_stale` (XAUTOCLAIM) once they have been idle for `min_idle_ms`.
- An entry that cannot be decoded, or that has been delivered more than `max_deliveries` times
  (it keeps killing its consumers), goes to the dead-letter stream with the error and is acked in
  the same script, so it is neither lost nor retried forever, and the service keeps running. The
  script also counts it under its source stream (RunKeys.dead_letter_counts) if the ack removed a
  pending entry, so a retried dead letter is counted once.
- Consumed entries are trimmed by the trusted service that consumed them (`trim_consumed`), never
  below an entry some group has not finished: the accounting counts at the source, not from lengths.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import redis
from redis.credentials import CredentialProvider

from shared.keys import RunKeys
from shared.messages import DeadLetter, Message, MessageDecodeError
from shared.streams import DEAD, StateKey, Stream

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)
M_co = TypeVar("M_co", bound=Message, covariant=True)

_PAYLOAD_FIELD = b"data"  # each entry holds one field: the msgpack-encoded message
PAYLOAD_FIELD = _PAYLOAD_FIELD  # for Lua scripts that read entries (services/coordinator/heartbeat_batch.py)
TRIM_BATCH_ENTRIES = 10_000  # entries one XTRIM may remove (Redis's own default for `~`: 100 nodes of 100)


@dataclass(frozen=True)
class Delivery(Generic[M_co]):
    """One decoded stream entry handed to a consumer; ack it once its effect is durable."""

    stream: str  # full name
    group: str
    message_id: str
    message: M_co
    num_deliveries: int


@dataclass(frozen=True)
class Entry(Generic[M_co]):
    """One decoded entry of a stream read without a group (nothing to ack)."""

    entry_id: str
    message: M_co


class UndecodableEntryError(MessageDecodeError):
    """An entry, read without a group, whose payload is not its stream's message type."""

    def __init__(self, entry_id: str, reason: str) -> None:
        super().__init__(reason)
        self.entry_id = entry_id


def connect(
    redis_url: str, socket_timeout_s: float = 30.0, credential_provider: CredentialProvider | None = None
) -> redis.Redis:
    """A bytes-mode client. BLOCK timeouts used by the bus stay well below `socket_timeout_s`. redis:// or
    rediss:// (TLS; query parameters such as ssl_ca_certs are honoured). `credential_provider`: the user and
    password come from it at every connect instead of from the URL (which must then carry none)."""
    return redis.Redis.from_url(
        redis_url, socket_timeout=socket_timeout_s, decode_responses=False, credential_provider=credential_provider
    )


class StreamBus:
    """One run's streams and state keys (names from `keys`) for one service (named in its dead letters)."""

    def __init__(self, client: redis.Redis, keys: RunKeys, *, service: str, max_deliveries: int = 3) -> None:
        self.redis = client
        self.keys = keys
        self.service = service
        self.max_deliveries = max_deliveries

    # producing
    def publish(
        self, stream: Stream[M], message: M, *, maxlen: int | None = None, tally: tuple[str, str] | None = None
    ) -> str:
        """XADD one message; returns its entry id. `maxlen` trims approximately (only for streams
        without consumer groups: trimming drops entries nobody has read). `tally` (hash key, field): a
        counter incremented in the same MULTI/EXEC (the reward service's tasks issued)."""
        name = self.keys.name_of(stream)
        if tally is None:
            return redis_text(
                self.redis.xadd(name, {_PAYLOAD_FIELD: message.encode()}, maxlen=maxlen, approximate=True)
            )
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.xadd(name, {_PAYLOAD_FIELD: message.encode()}, maxlen=maxlen, approximate=True)
            pipe.hincrby(tally[0], tally[1], 1)
            entry_id, _ = pipe.execute()
        return redis_text(entry_id)

    def publish_and_ack(
        self,
        stream: Stream[M],
        messages: Sequence[M],
        done: Sequence[Delivery[Message]],
        *,
        tally: tuple[str, str] | None = None,
        increments: Sequence[tuple[str, str, float]] = (),
    ) -> None:
        """XADD `messages` to `stream` and XACK the deliveries they were made from, in one MULTI/EXEC:
        a lost connection or a crash never leaves results without acks, nor acks without results
        (AOF logs the transaction as a unit). One round trip for the whole batch. `tally` (hash key,
        field): a counter raised by len(messages) in the same transaction; `increments` (hash key, field,
        amount): HINCRBYFLOATs in it too (what the messages carry, counted with them).

        Redis at `maxmemory` (noeviction) refuses the whole EXEC with an OOM error (XADD is a
        write that may grow memory), so a failed publish acks nothing either."""
        name = self.keys.name_of(stream)
        with self.redis.pipeline(transaction=True) as pipe:
            for message in messages:
                pipe.xadd(name, {_PAYLOAD_FIELD: message.encode()})
            for delivery in done:
                pipe.xack(delivery.stream, delivery.group, delivery.message_id)
            if tally is not None and messages:
                pipe.hincrby(tally[0], tally[1], len(messages))
            for key, field, amount in increments:
                pipe.hincrbyfloat(key, field, amount)
            pipe.execute()

    def publish_raw(self, stream: Stream[Any], payload: bytes) -> str:
        """XADD bytes as they are. For tests and tools that need to inject malformed payloads."""
        return redis_text(self.redis.xadd(self.keys.name_of(stream), {_PAYLOAD_FIELD: payload}))

    # consuming
    def ensure_group(self, stream: Stream[Any], start_id: str = "0") -> None:
        """Create the stream's consumer group (and the stream) if missing. start_id "0": a new group
        sees everything already in the stream, so nothing produced before a consumer started is lost."""
        try:
            self.redis.xgroup_create(self.keys.name_of(stream), _group_of(stream), id=start_id, mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def read(self, stream: Stream[M], consumer: str, *, count: int = 1, block_ms: int = 1000) -> list[Delivery[M]]:
        """New entries for this consumer (XREADGROUP >). Undecodable entries are dead-lettered, not returned."""
        name, group = self.keys.name_of(stream), _group_of(stream)
        response = self.redis.xreadgroup(group, consumer, {name: ">"}, count=count, block=block_ms)
        return self._decode_entries(stream, _entries_of(response), deliveries={})

    def read_own_pending(self, stream: Stream[M], consumer: str, *, count: int = 100) -> list[Delivery[M]]:
        """Entries delivered to this consumer name but never acked (XREADGROUP 0): what a restarted
        consumer with the same name must finish first."""
        name, group = self.keys.name_of(stream), _group_of(stream)
        response = self.redis.xreadgroup(group, consumer, {name: "0"}, count=count)
        entries = _entries_of(response)
        deliveries = self._delivery_counts(stream, [entry_id for entry_id, _ in entries])
        return self._decode_entries(stream, entries, deliveries)

    def claim_stale(self, stream: Stream[M], consumer: str, *, min_idle_ms: int, count: int = 10) -> list[Delivery[M]]:
        """Take over entries another consumer left pending for `min_idle_ms` (XAUTOCLAIM). Entries
        delivered more than `max_deliveries` times are dead-lettered instead of handed out again."""
        response = self.redis.xautoclaim(
            self.keys.name_of(stream),
            _group_of(stream),
            consumer,
            min_idle_time=min_idle_ms,
            start_id="0-0",
            count=count,
        )
        entries = [(entry_id, fields) for entry_id, fields in response[1] if fields is not None]
        deliveries = self._delivery_counts(stream, [entry_id for entry_id, _ in entries])
        return self._decode_entries(stream, entries, deliveries)

    def ack(self, stream: Stream[Any], message_ids: Sequence[str]) -> int:
        """XACK entries of the stream's group; returns how many were still pending."""
        if not message_ids:
            return 0
        return int(self.redis.xack(self.keys.name_of(stream), _group_of(stream), *message_ids))

    def ack_and_count(self, stream: Stream[Any], message_id: str, counter_key: str, counter_field: str) -> int:
        """XACK one entry and, only if it was still pending, HINCRBY `counter_field` of the hash
        `counter_key` by 1, atomically (one Lua script): a retried call whose first reply was lost
        counts nothing twice, and a crash never leaves the ack without the count. Returns 1 if acked now."""
        return int(
            cast(
                Any,
                self.redis.eval(
                    _ACK_AND_COUNT_SCRIPT,
                    2,
                    self.keys.name_of(stream),
                    counter_key,
                    _group_of(stream),
                    message_id,
                    counter_field,
                ),
            )
        )

    def counts(self, counter_key: str) -> dict[str, int]:
        """A hash of counters (as `ack_and_count` keeps them), field -> count."""
        raw = cast(dict[bytes, bytes], self.redis.hgetall(counter_key))
        return {redis_text(name): int(value) for name, value in raw.items()}

    def put_counts(self, counter_key: str, counts: dict[str, int]) -> None:
        """Set counters of a hash (fields not named keep their values)."""
        if counts:
            self.redis.hset(counter_key, mapping={name: count for name, count in counts.items()})

    def dead_letter(self, delivery: Delivery[Message], error: str, *, tally: tuple[str, str] | None = None) -> None:
        """Move a decoded entry whose processing failed to the dead-letter stream (and ack it). `tally`
        (hash key, field): a counter incremented in the same transaction (the learner's decisions)."""
        self._dead_letter_raw(
            delivery.stream,
            delivery.group,
            delivery.message_id,
            delivery.message.encode(),
            error,
            delivery.num_deliveries,
            tally,
        )

    # reading without a group (announcements, tooling, tests)
    def latest_entry(self, stream: Stream[M]) -> Entry[M] | None:
        """The newest entry (XREVRANGE, count 1), None if the stream is empty or missing. Raises
        UndecodableEntryError (with its id) if its payload is not a `stream.message_type`."""
        newest = _range_entries(self.redis.xrevrange(self.keys.name_of(stream), count=1))
        if not newest:
            return None
        raw_id, fields = newest[0]
        entry_id = redis_text(raw_id)
        try:
            return Entry(entry_id, stream.message_type.decode(fields.get(_PAYLOAD_FIELD, b"")))
        except MessageDecodeError as exc:
            raise UndecodableEntryError(entry_id, str(exc)) from exc

    def latest(self, stream: Stream[M]) -> M | None:
        """The newest message, None if there is none; raises MessageDecodeError if it is undecodable."""
        entry = self.latest_entry(stream)
        return None if entry is None else entry.message

    def entries(self, stream: Stream[M], *, count: int | None = None) -> list[M]:
        """The stream's messages, oldest first (XRANGE, the first `count` if given). Raises
        MessageDecodeError on an undecodable entry: for tooling and tests, not for consumers."""
        return [
            stream.message_type.decode(fields.get(_PAYLOAD_FIELD, b""))
            for _, fields in _range_entries(self.redis.xrange(self.keys.name_of(stream), count=count))
        ]

    def newest(self, stream: Stream[M], count: int, *, after_id: str = "0-0") -> tuple[list[M], int, str]:
        """The newest `count` entries after `after_id`, newest first (XREVRANGE): their messages, how many
        of them were undecodable (skipped), and the newest entry's id (`after_id` when there is none). For
        readers of streams read without a group that keep up with them."""
        messages: list[M] = []
        num_undecodable = 0
        raw = _range_entries(self.redis.xrevrange(self.keys.name_of(stream), min=f"({after_id}", count=count))
        for _, fields in raw:
            try:
                messages.append(stream.message_type.decode(fields.get(_PAYLOAD_FIELD, b"")))
            except MessageDecodeError:
                num_undecodable += 1
        return messages, num_undecodable, redis_text(raw[0][0]) if raw else after_id

    def wait_for_entries(self, stream: Stream[Any], *, after_id: str, block_ms: int) -> bool:
        """Block until the stream has an entry newer than `after_id` ("0-0": any entry), at most
        `block_ms` (XREAD BLOCK); True if there is one."""
        response = self.redis.xread({self.keys.name_of(stream): after_id}, count=1, block=block_ms)
        return bool(_entries_of(response))

    def dead_letters(self, count: int = 100) -> list[DeadLetter]:
        return self.entries(DEAD, count=count)

    # trimming (trusted consumers only: docs/operations.md, "Redis memory")
    def trim_consumed(self, stream: Stream[Any]) -> int:
        """Remove the entries of `stream` that every consumer group of it has finished: those below the
        oldest entry still pending in any group and below every group's last-delivered id (XTRIM MINID,
        approximate: whole internal nodes only, so a few consumed entries may stay). Returns how many
        were removed; 0 while no group exists (nobody is known to have consumed anything). Raises
        ValueError for a stream read without a group (`cap` bounds those)."""
        _group_of(stream)
        name = self.keys.name_of(stream)
        try:
            groups = self.redis.xinfo_groups(name)
        except redis.ResponseError:  # no such stream yet
            return 0
        if not groups:
            return 0
        point = min(self._oldest_unfinished(name, info) for info in groups)
        if point == (0, 0):
            return 0
        minid = f"{point[0]}-{point[1]}"
        # an approximate XTRIM removes at most TRIM_BATCH_ENTRIES per call (Redis's default LIMIT): repeat
        # until one removes nothing, so a stream that fell behind catches up, in steps that keep Redis responsive
        num_removed = 0
        while True:
            removed = int(
                cast(int, self.redis.execute_command("XTRIM", name, "MINID", "~", minid, "LIMIT", TRIM_BATCH_ENTRIES))
            )
            num_removed += removed
            if removed == 0:
                return num_removed

    def cap(self, stream: Stream[Any], max_entries: int) -> int:
        """Keep about the newest `max_entries` entries of a stream read without a group (XTRIM MAXLEN ~:
        at least that many stay); returns how many were removed."""
        if stream.group is not None:
            raise ValueError(f"stream {stream.name!r} has a consumer group: trim it with trim_consumed")
        return int(
            cast(int, self.redis.execute_command("XTRIM", self.keys.name_of(stream), "MAXLEN", "~", max_entries))
        )

    def _oldest_unfinished(self, name: str, info: dict[Any, Any]) -> tuple[int, int]:
        """The id of the oldest entry group `info` may still need: its oldest pending entry, or the one
        it delivered last (everything after it is undelivered), whichever is older."""
        last_delivered = _stream_id(info.get("last-delivered-id"))
        if not int(info.get("pending") or 0):
            return last_delivered
        summary = self.redis.xpending(name, redis_text(info.get("name")))
        oldest_pending = summary.get("min")
        return min(last_delivered, _stream_id(oldest_pending)) if oldest_pending is not None else last_delivered

    # state under one key
    def get_state(self, key: StateKey[M]) -> M | None:
        """The value last put, None if none was; raises MessageDecodeError if it is undecodable."""
        payload = cast(bytes | None, self.redis.get(self.keys.name_of(key)))  # a bytes-mode client (connect)
        return None if payload is None else key.message_type.decode(payload)

    def put_state(self, key: StateKey[M], state: M) -> None:
        self.redis.set(self.keys.name_of(key), state.encode())

    # inspecting
    def group_progress(self, stream: Stream[Any]) -> tuple[int, int]:
        """(lag, pending) of the stream's group: entries never delivered to it, and delivered but not acked."""
        name, group = self.keys.name_of(stream), _group_of(stream)
        try:
            groups = self.redis.xinfo_groups(name)
        except redis.ResponseError:  # no such stream yet
            return 0, 0
        for info in groups:
            if redis_text(info.get("name")) == group:
                lag = info.get("lag")
                if lag is None:  # Redis cannot tell after some trims: count conservatively
                    lag = self.redis.xlen(name)
                return int(lag), int(info.get("pending") or 0)
        return int(self.redis.xlen(name)), 0

    def backlog(self, stream: Stream[Any]) -> int:
        """Entries of `stream` its group has not finished: never delivered (lag) plus pending."""
        lag, pending = self.group_progress(stream)
        return lag + pending

    def length(self, stream: Stream[Any]) -> int:
        return int(self.redis.xlen(self.keys.name_of(stream)))

    # helpers
    def _decode_entries(
        self, stream: Stream[M], entries: list[tuple[bytes, dict[bytes, bytes]]], deliveries: dict[str, int]
    ) -> list[Delivery[M]]:
        name, group = self.keys.name_of(stream), _group_of(stream)
        decoded: list[Delivery[M]] = []
        for raw_id, fields in entries:
            entry_id = redis_text(raw_id)
            payload = fields.get(_PAYLOAD_FIELD, b"")
            num_deliveries = deliveries.get(entry_id, 1)
            if num_deliveries > self.max_deliveries:
                self._dead_letter_raw(
                    name, group, entry_id, payload, f"delivered {num_deliveries} times without ack", num_deliveries
                )
                continue
            try:
                message = stream.message_type.decode(payload)
            except MessageDecodeError as exc:
                self._dead_letter_raw(name, group, entry_id, payload, str(exc), num_deliveries)
                continue
            decoded.append(Delivery(name, group, entry_id, message, num_deliveries))
        return decoded

    def _delivery_counts(self, stream: Stream[Any], entry_ids: list[bytes]) -> dict[str, int]:
        name, group = self.keys.name_of(stream), _group_of(stream)
        counts: dict[str, int] = {}
        for entry_id in entry_ids:
            for info in self.redis.xpending_range(name, group, min=entry_id, max=entry_id, count=1):
                counts[redis_text(entry_id)] = int(info["times_delivered"])
        return counts

    def _dead_letter_raw(
        self,
        stream: str,
        group: str,
        entry_id: str,
        payload: bytes,
        error: str,
        num_deliveries: int,
        tally: tuple[str, str] | None = None,
    ) -> None:
        letter = DeadLetter(
            run_id=self.keys.run_id,
            source_stream=stream,
            source_message_id=entry_id,
            consumer_group=group,
            service=self.service,
            error=error[:4000],
            payload=payload,
            num_deliveries=num_deliveries,
        )
        log.warning("dead-letter %s %s: %s", stream, entry_id, error[:300])
        counts = self.keys.dead_letter_counts
        self.redis.eval(
            _DEAD_LETTER_SCRIPT,
            4,
            self.keys.name_of(DEAD),
            stream,
            counts,
            tally[0] if tally is not None else counts,
            letter.encode(),
            group,
            entry_id,
            stream.removeprefix(self.keys.prefix),
            tally[1] if tally is not None else "",
        )


# KEYS: dead, source stream, dead-letter counts, tally hash; ARGV: letter, group, entry id, counts field,
# tally field ('' none). The XADD comes first: at maxmemory it is refused and nothing else happens (no ack).
_DEAD_LETTER_SCRIPT = """
redis.call('XADD', KEYS[1], '*', 'data', ARGV[1])
local acked = redis.call('XACK', KEYS[2], ARGV[2], ARGV[3])
if acked == 1 then
  redis.call('HINCRBY', KEYS[3], ARGV[4], 1)
  if ARGV[5] ~= '' then redis.call('HINCRBY', KEYS[4], ARGV[5], 1) end
end
return acked
"""

# KEYS: stream, counter hash; ARGV: group, entry id, counter field
_ACK_AND_COUNT_SCRIPT = """
local acked = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if acked == 1 then redis.call('HINCRBY', KEYS[2], ARGV[3], 1) end
return acked
"""


def _group_of(stream: Stream[Any]) -> str:
    if stream.group is None:
        raise ValueError(f"stream {stream.name!r} is read without a consumer group")
    return stream.group


def _entries_of(response: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """XREADGROUP and XREAD answer [[stream, [(id, fields), ...]]] (RESP2) or {stream: [[...]]} (RESP3)."""
    if not response:
        return []
    if isinstance(response, dict):
        streams = [entries[0] if entries and isinstance(entries[0], list) else entries for entries in response.values()]
    else:
        streams = [entries for _, entries in response]
    return [(entry_id, fields) for entries in streams for entry_id, fields in entries if fields is not None]


def _range_entries(response: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """XRANGE / XREVRANGE answer [(id, fields), ...] (bytes: the client does not decode responses)."""
    return [(entry_id, fields) for entry_id, fields in response or [] if fields is not None]


def _stream_id(value: object) -> tuple[int, int]:
    """A stream id "<ms>-<seq>" as a pair that orders like the id."""
    milliseconds, _, sequence = redis_text(value).partition("-")
    return int(milliseconds), int(sequence or 0)


def redis_text(value: object, *, errors: str = "strict") -> str:
    """A Redis reply value (bytes from a bytes-mode client, or already str) as text: the one bytes-to-text
    helper. `errors` as bytes.decode's: "replace" where a value that is not UTF-8 must not stop the reader (the
    accounting CLI, the relay and broadcast views, which parse what they read leniently)."""
    return value.decode(errors=errors) if isinstance(value, bytes) else str(value)
