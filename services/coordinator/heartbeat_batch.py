"""The heartbeat script, and heartbeats coalesced into one call of it: the ones that arrive while a call
is in flight ride the next one.

At 1000 workers beating once a second, one call per heartbeat costs the coordinator's event loop more
in the Redis client than the rest of the request, and a pause of the host (CPU steal, a GC pass) leaves
hundreds of calls queued behind each other. Here a burst of N heartbeats is one EVALSHA with N entries:
the per-call cost is paid once, and the queue a pause leaves behind drains in a few calls. With no
load a heartbeat goes out alone, at once: batching adds no wait.

Each entry, atomically per worker (the script runs them one after the other; a batch is not a
transaction across workers):
  1. the token's sha256 against the stored one (skipped when the caller authenticated already);
  2. the lease: one that ran out -> the worker is dead (code DEAD); else extended, the reported fields stored;
  3. the reported weight swap, the first time it is reported, if its version was announced by the
     learner (the announcements hash, else the newest entries of the learner's `weights` stream,
     decoded in the script: services/coordinator/announcements.py) and it happened between the start
     of that publication (minus the clock skew tolerated) and now: recorded for T_bcast
     (services/coordinator/broadcast_times.py: the per-version swap, its readiness time and rollout
     pause when reported, the worker's latest swap and its download rate measured from the learner's
     announcement time). Any other report is ignored; the outcome says why, and whether the swap was
     news. Completing a version is the caller's business.
  4. with that swap, what the worker observed of its relay parent (`parent_url`, `parent_bytes`), kept
     only when the coordinator assigned it that parent (`relay_assigned`, written when it served the
     worker's GET /parent): its latest observation (`relay_observed`), and, when it got any part of
     the version elsewhere than from the parent, one more miss of that parent (`relay_misses`, by URL). The
     relay plan ranks parents by these (services/coordinator/relay_view.py, shared/weight_channel/relay_plan.py).
Both the REST endpoint (WorkerRegistry.extend_lease, one entry, synchronous) and the hot path
(services/coordinator/heartbeat_path.py, batched) run this one script.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from services.coordinator.broadcast_times import MIN_MEASURED_BYTES, SWAPS_TTL_S, RelayKeys
from services.coordinator.liveness_lua import MARK_DEAD_LUA
from services.coordinator.redis_script import ScriptConnection
from shared.api import WeightSwapReport
from shared.bus import PAYLOAD_FIELD, redis_text
from shared.keys import RunKeys
from shared.streams import WEIGHTS

# KEYS: leases, broadcast announced (publication start), broadcast last swap, broadcast throughput, the
#   weights stream, broadcast pending, broadcast times, broadcast published (announcement time), relay
#   assigned (worker -> parent URL served), relay observed (worker -> its latest observation of its
#   parent), relay misses (parent URL -> "<version> <count>"); then 3 per
#   entry: the worker hash, the swaps hash and the swap-splits hash of the reported version (the worker
#   hash in their places when there is no report).
# ARGV: the swaps hashes' TTL, the clock skew tolerated (s), the smallest download measured (bytes), the
#   largest rate recorded (Mbit/s), the run id, the stream entries' payload field, how many of the newest
#   announcements to look through, the dead workers' sorted set, the credential keys' prefix (a worker found
#   dead leaves its credential's live set: services/coordinator/liveness_lua.py); then 12 per entry: worker id, token sha256 ('' = authenticated
#   already), now_s, new expiry_s, the fields to set (a JSON object of strings), the reported version
#   ('' = no report), swapped_at_s, num_bytes, ready_at_s and pause_s ('' = not reported), parent_url
#   ('' = not reported) and parent_bytes.
# Returns 3 per entry: code (0 unknown worker, -1 wrong token, 1 dead, 2 ok), state, swap (1 news, 0 none
#   or not news, -1 ignored: the learner never announced the version, -2 ignored: swapped before its
#   publication start or after now, beyond the skew).
HEARTBEAT_LUA = (
    MARK_DEAD_LUA
    + """
local leases, announced, last_swap, throughput = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local weights, pending, times, published = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local assigned, observed, misses = KEYS[9], KEYS[10], KEYS[11]
local skew, min_bytes, max_mbps = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local run_id, payload_field, lookback = ARGV[5], ARGV[6], ARGV[7]
local dead, credential_prefix = ARGV[8], ARGV[9]
-- (publication start, announcement time) of `version`: the announcements hashes, else the newest entries
-- of the learner's stream (decoded here, so a report right after an announcement finds it; recorded for
-- the next one). The start is publish_started_at_s when the learner said (0 < it <= published_at_s),
-- else published_at_s: the same rule as Announcements.ingest.
local function announced_at_of(version)
  local at = tonumber(redis.call('HGET', announced, version) or '')
  if at then return at, tonumber(redis.call('HGET', published, version) or '') or at end
  for _, entry in ipairs(redis.call('XREVRANGE', weights, '+', '-', 'COUNT', lookback)) do
    local fields = entry[2]
    for j = 1, #fields, 2 do
      if fields[j] == payload_field then
        local ok, msg = pcall(cmsgpack.unpack, fields[j + 1])
        if ok and type(msg) == 'table' and msg.run_id == run_id and tostring(msg.policy_version) == version
          and type(msg.published_at_s) == 'number' and msg.published_at_s == msg.published_at_s then
          local at_s, start_s = msg.published_at_s, msg.publish_started_at_s
          if type(start_s) ~= 'number' or not (start_s > 0 and start_s <= at_s) then start_s = at_s end
          redis.call('HSETNX', announced, version, string.format('%.17g', start_s))
          redis.call('HSETNX', published, version, string.format('%.17g', at_s))
          if redis.call('HEXISTS', times, version) == 0 then
            redis.call('ZADD', pending, 'NX', start_s, version)
          end
          return start_s, at_s
        end
      end
    end
  end
  return nil, nil
end
local out = {}
for i = 0, (#ARGV - 9) / 12 - 1 do
  local k, a = 11 + i * 3, 9 + i * 12
  local worker, swaps, splits = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  local worker_id, digest_in, now_s, expiry_s, fields = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5]
  local version, swapped_at_s, num_bytes = ARGV[a + 6], ARGV[a + 7], ARGV[a + 8]
  local ready_at_s, pause_s = ARGV[a + 9], ARGV[a + 10]
  local parent_url, parent_bytes = ARGV[a + 11], tonumber(ARGV[a + 12])
  local code, state, news = 2, '', 0
  local digest = redis.call('HGET', worker, 'token_sha256')
  if not digest then
    code = 0
  elseif digest_in ~= '' and digest ~= digest_in then
    code = -1
  else
    state = redis.call('HGET', worker, 'state')
    local expiry = redis.call('ZSCORE', leases, worker_id)
    if state == 'dead' then
      code = 1
    elseif (not expiry) or tonumber(expiry) <= tonumber(now_s) then
      mark_dead(worker, leases, dead, credential_prefix, worker_id, expiry or now_s)
      code, state = 1, 'dead'
    else
      redis.call('ZADD', leases, expiry_s, worker_id)
      local flat = {'lease_expires_at_s', expiry_s}
      for name, value in pairs(cjson.decode(fields)) do
        flat[#flat + 1] = name
        flat[#flat + 1] = value
      end
      redis.call('HSET', worker, unpack(flat))
      -- a worker repeats its last swap in every heartbeat: only the first report needs the announcement
      if version ~= '' and redis.call('HEXISTS', swaps, worker_id) == 0 then
        local started_at, announced_at = announced_at_of(version)
        local swapped = tonumber(swapped_at_s)
        if not started_at then
          news = -1
        elseif swapped < started_at - skew or swapped > tonumber(now_s) + skew then
          news = -2
        else
          news = 1
          redis.call('HSET', swaps, worker_id, swapped_at_s)
          redis.call('EXPIRE', swaps, ARGV[1])
          if ready_at_s ~= '' or pause_s ~= '' then
            redis.call('HSET', splits, worker_id, ready_at_s .. ':' .. pause_s)
            redis.call('EXPIRE', splits, ARGV[1])
          end
          redis.call('HSET', last_swap, worker_id, version .. ':' .. swapped_at_s)
          -- the download rate over the transfer: from the announcement, not the publication start
          local seconds, bytes = swapped - announced_at, tonumber(num_bytes)
          if bytes >= min_bytes and seconds > 0 then
            redis.call('HSET', throughput, worker_id, tostring(math.min(bytes * 8 / seconds / 1e6, max_mbps)))
          end
          -- its parent's delivery, only about the parent it was assigned (a child cannot name another)
          if parent_url ~= '' and bytes > 0 and redis.call('HGET', assigned, worker_id) == parent_url then
            local done_at = tonumber(ready_at_s ~= '' and ready_at_s or swapped_at_s)
            redis.call('HSET', observed, worker_id, version .. ' ' .. ARGV[a + 12] .. ' ' .. num_bytes .. ' '
              .. string.format('%.17g', done_at - announced_at) .. ' ' .. parent_url)
            -- a miss: the parent did not deliver the whole version (relay_plan.py ParentObservation.missed)
            if parent_bytes < bytes then
              local count = tonumber(string.match(redis.call('HGET', misses, parent_url) or '', ' (%d+)$') or '0')
              redis.call('HSET', misses, parent_url, version .. ' ' .. (count + 1))
            end
          end
        end
      end
    end
  end
  out[#out + 1] = code
  out[#out + 1] = state
  out[#out + 1] = news
end
return out
"""
)

OK = 2
UNKNOWN, WRONG_TOKEN, DEAD = 0, -1, 1
UNANNOUNCED, OUT_OF_TIME = "unannounced", "time"
SWAP_IGNORED_REASONS = {-1: UNANNOUNCED, -2: OUT_OF_TIME}
MAX_CLOCK_SKEW_S = 2.0  # a swap this far before its publication start or after now still counts (clamped to 0)
MAX_MEASURED_MBPS = 1e6  # a measured download rate is recorded at most this (a 1 ms swap of 4 MiB is not 32 Gbit/s)
ANNOUNCEMENT_LOOKBACK = 16  # newest announcements a report of a version not recorded yet is looked up in
MAX_BATCH = 256  # entries per script call: Redis serves nothing else while a script runs (~5 us an entry)


@dataclass(frozen=True)
class HeartbeatEntry:
    """One worker's heartbeat as the script takes it."""

    worker_id: str
    token_sha256: str  # '' when the caller has authenticated the worker already
    now_s: float
    expiry_s: float
    fields: Mapping[str, str]  # the record fields to store (worker_registry.heartbeat_fields)
    swap: WeightSwapReport | None


@dataclass(frozen=True)
class HeartbeatOutcome:
    code: int  # OK, UNKNOWN, WRONG_TOKEN or DEAD
    state: str
    swap_is_news: bool
    swap_ignored: str | None = None  # why the reported swap was ignored (UNANNOUNCED, OUT_OF_TIME), else None


def script_arguments(keys: RunKeys, entries: Sequence[HeartbeatEntry]) -> tuple[list[str], list[str]]:
    """(KEYS, ARGV) of one script call carrying `entries`."""
    script_keys = [
        keys.worker_leases,
        keys.broadcast_announced,
        keys.broadcast_last_swap,
        keys.broadcast_throughput,
        keys.name_of(WEIGHTS),
        keys.broadcast_pending,
        keys.broadcast_times,
        keys.broadcast_published,
        *RelayKeys.of(keys).all,
    ]
    args = [str(SWAPS_TTL_S), repr(MAX_CLOCK_SKEW_S), str(MIN_MEASURED_BYTES), repr(MAX_MEASURED_MBPS)]
    args += [keys.run_id, PAYLOAD_FIELD.decode(), str(ANNOUNCEMENT_LOOKBACK), keys.worker_dead, keys.credential_prefix]
    for e in entries:
        worker_key = keys.worker(e.worker_id)
        swap = e.swap
        if swap is None:
            script_keys += (worker_key, worker_key, worker_key)
        else:
            v = swap.policy_version
            script_keys += (worker_key, keys.broadcast_swaps(v), keys.broadcast_swap_splits(v))
        args += (e.worker_id, e.token_sha256, repr(e.now_s), repr(e.expiry_s), json.dumps(e.fields))
        if swap is None:
            args += ("", "", "", "", "", "", "0")
        else:
            args += (str(swap.policy_version), repr(swap.swapped_at_s), str(swap.num_bytes))
            args += (_optional(swap.ready_at_s), _optional(swap.pause_s), swap.parent_url, str(swap.parent_bytes))
    return script_keys, args


def _optional(value: float | None) -> str:
    return "" if value is None else repr(value)


def parse_outcomes(flat: Sequence[Any]) -> list[HeartbeatOutcome]:
    outcomes = []
    for i in range(0, len(flat), 3):
        swap = int(flat[i + 2])
        state = redis_text(flat[i + 1])
        outcomes.append(HeartbeatOutcome(int(flat[i]), state, swap == 1, SWAP_IGNORED_REASONS.get(swap)))
    return outcomes


class HeartbeatBatcher:
    """`await submit(entry)` -> its outcome. One call in flight at a time; what queues meanwhile goes
    out together in the next call. A failed call fails every heartbeat in it with the same error."""

    def __init__(self, client: redis.Redis, keys: RunKeys, max_batch: int = MAX_BATCH) -> None:
        self.connection = ScriptConnection.like(
            client, HEARTBEAT_LUA
        )  # redis-py's asyncio client costs ~8x more a call
        self.keys = keys
        self.max_batch = max_batch
        self._queue: list[tuple[HeartbeatEntry, asyncio.Future[HeartbeatOutcome]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self.num_calls = 0
        self.num_entries = 0

    async def close(self) -> None:
        await self.connection.close()

    async def submit(self, entry: HeartbeatEntry) -> HeartbeatOutcome:
        future: asyncio.Future[HeartbeatOutcome] = asyncio.get_running_loop().create_future()
        self._queue.append((entry, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="heartbeat-batch")
        return await future

    async def _flush(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            try:
                outcomes = await self._call([entry for entry, _ in batch])
            except Exception as exc:  # boundary: the error belongs to the heartbeats that rode this call
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), outcome in zip(batch, outcomes, strict=True):
                if not future.done():  # the request may have been cancelled (client went away)
                    future.set_result(outcome)

    async def _call(self, entries: list[HeartbeatEntry]) -> list[HeartbeatOutcome]:
        outcomes = parse_outcomes(await self.connection.call(*script_arguments(self.keys, entries)))
        self.num_calls += 1
        self.num_entries += len(entries)
        return outcomes
