"""The work API's Lua scripts (services/coordinator/work_leases.py calls them): each is one atomic step, so a
check and its effects cannot be split by a concurrent call.

A lease is a pending entry of `tasks` in the `rollout` group, its consumer named after the worker id. Besides
the per-worker and total counters (shared/work_counts.py), every step keeps three records up to date:

    identity     (its counters' hash, RunKeys.work_counts) `credential` (the join credential it registered
                 with), `allowance` (leases it has earned the right to hold), `cut_at_s`, and how many of its
                 groups the reward service had scored (`scored_seen`) and refused (`rejected_seen`) when the
                 work API last looked
    credential   (RunKeys.credential_work) `allowance`, `held` (leases its identities hold now), `share` (set by
                 the control loop), `cut_at_s`, and the counters of all its identities together, with `scored`
                 and `rejected`
    speculative  (RunKeys.work_speculative) the leases taken by an identity still earning its allowance: the
                 task feed issues that many tasks beyond its window, so what an unproven identity holds never
                 shrinks what the proven fleet can work on

Leases are earned, as in TCP's slow start ([work] earn_leases, on): a new identity, and a new credential, may
hold INITIAL_ALLOWANCE leases; each of its groups the reward service scores adds one (up to [work]
max_held_tasks for an identity, the credential's max_leases for a credential), so an honest worker doubles its
allowance every batch; a lease it lets expire or fails halves it (at least 1, at most once per lease time: a
batch lost together is one loss). An identity below max_held_tasks is still earning: its leases are
speculative. What a lease call may take is the least of the identity's room (allowance - held) and its
credential's (min(allowance, max_leases, share) - held). With earn_leases off (a trusted fleet) every
identity and credential holds its cap from the start and nothing is speculative.

Expired leases (a holder that did not answer within the lease time) go first to an identity of another
credential that has earned its full allowance; back to the holder's own credential, or to an identity still
earning, only after a second lease time. A task is dead-lettered once MAX_LEASES_PER_TASK proven holders let
it expire (it keeps killing workers); a speculative holder's expiry is not counted (XCLAIM RETRYCOUNT), so
unproven identities passing a task among themselves cannot destroy it. For the same reason a speculative
holder that reports a task failed gives it back (pending, idle as if expired) instead of dead-lettering it,
until the task was given back MAX_LEASES_PER_TASK times (a poison task every newcomer fails).
"""

from __future__ import annotations

MAX_LEASES_PER_TASK = 3  # as the bus's max_deliveries: a task that expired this often is dead-lettered
INITIAL_ALLOWANCE = 2  # leases a new identity, and a new credential, may hold before any of its groups is scored

# Functions every script below starts with. Keys are built from prefixes (one Redis, not a cluster):
#   counts_prefix .. worker id            the identity's counters and record (RunKeys.work_counts)
#   credential_prefix .. id .. ':work'    the credential's record (RunKeys.credential_work)
_LIB = """
local function number(value, default) return tonumber(value or '') or default end

-- the join credential whose identity took a lease (recorded at its first lease; '' the shared token)
local function credential_of(counts_prefix, worker_id)
  return redis.call('HGET', counts_prefix .. worker_id, 'credential') or ''
end

local function work_key(credential_prefix, credential) return credential_prefix .. credential .. ':work' end

-- leases held by a credential's identities, +- delta (never below 0: the control loop reconciles it)
local function add_held(credential_prefix, credential, delta)
  local key = work_key(credential_prefix, credential)
  if redis.call('HINCRBY', key, 'held', delta) < 0 then redis.call('HSET', key, 'held', 0) end
end

-- a lease ended unanswered (expired, or failed): halve the allowance of the identity and of its credential,
-- each at most once per lease time
local function cut(counts_prefix, credential_prefix, worker_id, credential, now_s, lease_s, initial)
  for _, key in ipairs({counts_prefix .. worker_id, work_key(credential_prefix, credential)}) do
    if now_s - number(redis.call('HGET', key, 'cut_at_s'), -1e18) >= lease_s then
      local allowance = number(redis.call('HGET', key, 'allowance'), initial)
      redis.call('HSET', key, 'allowance', math.max(1, math.floor(allowance / 2)), 'cut_at_s', string.format('%.17g', now_s))
    end
  end
end

-- the allowances a new identity and a new credential start with: INITIAL_ALLOWANCE while leases are earned,
-- else their caps
local function initials(earn, initial, max_held, max_credential)
  if earn then return initial, initial end
  return max_held, max_credential
end

-- the groups of an identity the reward service scored (or refused) since the work API last looked: each scored
-- one adds a lease to the identity's allowance (up to max_held) and its credential's (up to max_credential);
-- both kinds add to the credential's record
local function fold(counts_prefix, credential_prefix, rewards_prefix, worker_id, credential, earn, initial, max_held, max_credential)
  local initial_own, initial_credential = initials(earn, initial, max_held, max_credential)
  local counts, work = counts_prefix .. worker_id, work_key(credential_prefix, credential)
  local judged = redis.call('HMGET', rewards_prefix .. worker_id, 'num_groups', 'num_rejected')
  local scored, rejected = math.floor(number(judged[1], 0)), math.floor(number(judged[2], 0))
  local seen = redis.call('HMGET', counts, 'scored_seen', 'rejected_seen')
  local new_scored, new_rejected = scored - number(seen[1], 0), rejected - number(seen[2], 0)
  if new_scored > 0 then
    local allowance = number(redis.call('HGET', counts, 'allowance'), initial_own)
    redis.call('HSET', counts, 'allowance', math.min(max_held, allowance + new_scored), 'scored_seen', scored)
    local earned = number(redis.call('HGET', work, 'allowance'), initial_credential)
    redis.call('HSET', work, 'allowance', math.min(max_credential, earned + new_scored))
    redis.call('HINCRBY', work, 'scored', new_scored)
  end
  if new_rejected > 0 then
    redis.call('HSET', counts, 'rejected_seen', rejected)
    redis.call('HINCRBY', work, 'rejected', new_rejected)
  end
end

-- one more `field` for a worker, the run and the worker's credential
local function count(counts_prefix, credential_prefix, totals, worker_id, credential, field, delta)
  redis.call('HINCRBY', counts_prefix .. worker_id, field, delta)
  redis.call('HINCRBY', totals, field, delta)
  redis.call('HINCRBY', work_key(credential_prefix, credential), field, delta)
end
"""

# KEYS: tasks, caller's worker hash, worker leases (zset), caller's counts, totals, work worker ids (set),
#   speculative (set)
# ARGV: group, caller id, now_s, lease ms, max tasks, pending scan limit, counts key prefix, max leases per task,
#   max leases held by one identity, credential key prefix, operator key prefix, operator quarantine key
#   prefix, worker rewards key prefix, INITIAL_ALLOWANCE, default max leases of a credential, '1' when leases
#   are earned ('' not)
# Returns {state} when the caller may not lease ('unknown', 'dead', 'quarantined' for a quarantined credential,
# or its state), else {'active', entries, retire}: entries [[id, [field, value, ...]], ...] leased to the caller
# and retire [[id, holder], ...], expired entries leased too often, for the caller to dead-letter (RETIRE).
LEASE = (
    _LIB
    + """
local state = redis.call('HGET', KEYS[2], 'state')
if not state then return {'unknown'} end
local expiry = redis.call('ZSCORE', KEYS[3], ARGV[2])
if (not expiry) or tonumber(expiry) <= tonumber(ARGV[3]) then return {'dead'} end
if state ~= 'active' then return {state} end
local caller, now_s, lease_ms, wanted = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local counts_prefix, max_leases, max_held = ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9])
local credential_prefix, operator_prefix, initial = ARGV[10], ARGV[11], tonumber(ARGV[14])
local earn = ARGV[16] ~= ''
local credential = redis.call('HGET', KEYS[2], 'operator_id') or ''
if credential ~= '' and (redis.call('SCARD', ARGV[12] .. credential) > 0
    or (redis.call('HGET', operator_prefix .. credential, 'quarantine_reason') or '') ~= '') then
  return {'quarantined'}
end
local max_credential = number(redis.call('HGET', operator_prefix .. credential, 'max_leases'), tonumber(ARGV[15]))
redis.call('HSETNX', KEYS[4], 'credential', credential)
fold(counts_prefix, credential_prefix, ARGV[13], caller, credential, earn, initial, max_held, max_credential)
local work = work_key(credential_prefix, credential)
local initial_own, initial_credential = initials(earn, initial, max_held, max_credential)
local allowance = math.min(max_held, number(redis.call('HGET', KEYS[4], 'allowance'), initial_own))
local earned = number(redis.call('HGET', work, 'allowance'), initial_credential)
if not earn then allowance, earned = max_held, max_credential end
local share = number(redis.call('HGET', work, 'share'), math.huge)
local credential_room = math.min(earned, max_credential, share) - number(redis.call('HGET', work, 'held'), 0)
local own_held = #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', max_held, caller)
local room = math.min(allowance - own_held, credential_room)
local full = ''  -- why a call that gets nothing got nothing: services/coordinator/lease_pacing.py
if allowance - own_held <= 0 then full = 'own' elseif credential_room <= 0 then full = 'credential' end
local speculative = earn and allowance < max_held
local entries, retire = {}, {}
for _, p in ipairs(redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', ARGV[6])) do
  if #entries >= wanted then break end
  local holder = p[2]
  local own = holder == caller
  local holder_credential = own and credential or credential_of(counts_prefix, holder)
  local first = holder_credential ~= credential and not speculative
  local min_idle = first and lease_ms or 2 * lease_ms
  if p[3] >= min_idle then
    local was_speculative = redis.call('SISMEMBER', KEYS[7], p[1]) == 1
    local counted = p[4] - (was_speculative and 1 or 0)
    if counted >= max_leases then
      retire[#retire + 1] = {p[1], holder}
    elseif own or room > 0 then
      local claimed = redis.call('XCLAIM', KEYS[1], ARGV[1], caller, min_idle, p[1], 'RETRYCOUNT', counted + 1)
      count(counts_prefix, credential_prefix, KEYS[5], holder, holder_credential, 'expired', 1)
      if earn then cut(counts_prefix, credential_prefix, holder, holder_credential, now_s, lease_ms / 1000, initial) end
      if was_speculative then redis.call('SREM', KEYS[7], p[1]) end
      if claimed[1] then
        entries[#entries + 1] = claimed[1]
        if speculative then redis.call('SADD', KEYS[7], p[1]) end
      end
      if not own then
        add_held(credential_prefix, holder_credential, -1)
        if claimed[1] then
          add_held(credential_prefix, credential, 1)
          room = room - 1
        end
      elseif not claimed[1] then
        add_held(credential_prefix, credential, -1)  -- the entry was deleted: nobody holds it now
      end
    end
  end
end
local fresh = math.min(wanted - #entries, room)
if fresh > 0 then
  local read = redis.call('XREADGROUP', 'GROUP', ARGV[1], caller, 'COUNT', fresh, 'STREAMS', KEYS[1], '>')
  if read then
    for _, entry in ipairs(read[1][2]) do
      entries[#entries + 1] = entry
      add_held(credential_prefix, credential, 1)
      if speculative then redis.call('SADD', KEYS[7], entry[1]) end
    end
  end
end
if #entries > 0 then
  count(counts_prefix, credential_prefix, KEYS[5], caller, credential, 'leased', #entries)
  redis.call('SADD', KEYS[6], caller)
end
if #entries > 0 then full = '' end
return {'active', entries, retire, full}
"""
)

# KEYS: tasks, rollouts, caller's counts, totals, work worker ids (set), caller's worker record, the lease's
#   answered marker, speculative (set)
# ARGV: group, caller id, lease id, refusal ('1': refuse, '' accept), payload (the group, or the dead letter of a
#   refusal), the dead letter to write when the lease is not held, the group's number of samples,
#   "<caller id>:<sha256 of the answer>", the marker's TTL (s), counts key prefix, credential key prefix, how many
#   refusals of one credential are kept
# An accepted group also counts on the caller's record (num_groups_done, num_samples_done: what /v1/workers and
# the dashboard show), only if the record still exists. A refusal's dead letter goes to the caller's
# credential's own capped stream (RunKeys.credential_refusals).
# Returns {1, rollouts entry id} accepted, {1, 'repeat'} the caller's accepted answer sent again (nothing
# written), {0, 'held'} refused for its content, {0, 'not-held'}.
ANSWER = (
    _LIB
    + """
local caller, counts_prefix, credential_prefix = ARGV[2], ARGV[10], ARGV[11]
local credential = redis.call('HGET', KEYS[6], 'operator_id') or credential_of(counts_prefix, caller)
local refusals = credential_prefix .. credential .. ':refusals'
redis.call('SADD', KEYS[5], caller)
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #pending == 0 or pending[1][2] ~= caller then
  if redis.call('GET', KEYS[7]) == ARGV[8] then return {1, 'repeat'} end
  redis.call('XADD', refusals, 'MAXLEN', '~', ARGV[12], '*', 'data', ARGV[6])
  count(counts_prefix, credential_prefix, KEYS[4], caller, credential, 'refused', 1)
  return {0, 'not-held'}
end
count(counts_prefix, credential_prefix, KEYS[4], caller, credential, 'returned', 1)
if ARGV[4] ~= '' then
  redis.call('XADD', refusals, 'MAXLEN', '~', ARGV[12], '*', 'data', ARGV[5])
  count(counts_prefix, credential_prefix, KEYS[4], caller, credential, 'refused', 1)
  return {0, 'held'}
end
local id = redis.call('XADD', KEYS[2], '*', 'data', ARGV[5])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('SREM', KEYS[8], ARGV[3])
add_held(credential_prefix, credential, -1)
redis.call('SET', KEYS[7], ARGV[8], 'EX', ARGV[9])
count(counts_prefix, credential_prefix, KEYS[4], caller, credential, 'accepted', 1)
if redis.call('EXISTS', KEYS[6]) == 1 then
  redis.call('HINCRBY', KEYS[6], 'num_groups_done', 1)
  redis.call('HINCRBY', KEYS[6], 'num_samples_done', ARGV[7])
end
return {1, id}
"""
)

# KEYS: tasks, dead, totals, work worker ids (set), speculative (set). ARGV: group, entry id, holder, min idle ms,
#   dead letter, counts key prefix, counter field, delta, credential key prefix, '1' to halve the holder's
#   allowance ('' not), now_s, lease s, INITIAL_ALLOWANCE.
# Dead-letters and acks the entry if `holder` still holds it, idle that long; counts `delta` on the holder's,
# its credential's and the total `field`. Returns 1 if it did.
RETIRE = (
    _LIB
    + """
local holder, counts_prefix, credential_prefix = ARGV[3], ARGV[6], ARGV[9]
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', ARGV[4], ARGV[2], ARGV[2], 1)
if #pending == 0 or pending[1][2] ~= holder then return 0 end
local credential = credential_of(counts_prefix, holder)
redis.call('XADD', KEYS[2], '*', 'data', ARGV[5])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('SREM', KEYS[5], ARGV[2])
add_held(credential_prefix, credential, -1)
count(counts_prefix, credential_prefix, KEYS[3], holder, credential, ARGV[7], ARGV[8])
if ARGV[10] ~= '' then
  cut(counts_prefix, credential_prefix, holder, credential, tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13]))
end
redis.call('SADD', KEYS[4], holder)
return 1
"""
)

# KEYS: tasks, speculative (set). ARGV: group, entry id, caller id, lease ms, max leases per task.
# A task a speculative holder cannot serve goes back: still pending under the caller, idle as if its lease had run
# out, so the next lease call of a proven identity of another credential takes it (then it counts `expired` for
# the caller, its allowance halved). Each give-back counts as a delivery (RETRYCOUNT + 1, which the speculative
# discount then leaves counted): a task given back MAX_LEASES_PER_TASK times is not given back again but
# dead-lettered by the caller (a poison task that every newcomer fails still ends). Returns 1 given back, 0 not
# (not held by the caller, not speculative, or given back too often).
GIVE_BACK = """
if redis.call('SISMEMBER', KEYS[2], ARGV[2]) == 0 then return 0 end
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #pending == 0 or pending[1][2] ~= ARGV[3] then return 0 end
if pending[1][4] >= tonumber(ARGV[5]) then return 0 end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, ARGV[2], 'IDLE', ARGV[4], 'RETRYCOUNT', pending[1][4] + 1)
return 1
"""

# KEYS: tasks, speculative (set). ARGV: group, credential key prefix, counts key prefix, then the ids of the
# credentials known to hold leases (their `held` set to 0 unless they hold some).
# What the scripts above keep as counters, recounted from XPENDING (the truth): each credential's `held`, and the
# speculative set without entries no longer pending. Run by the control loop; heals a count left wrong by an
# older coordinator or a script that failed half-way. Returns the number of leases held in all.
RECONCILE = (
    _LIB
    + """
local held = {}
local total = 0
local summary = redis.call('XPENDING', KEYS[1], ARGV[1])
for _, consumer in ipairs(summary[4] or {}) do
  local credential = credential_of(ARGV[3], consumer[1])
  held[credential] = (held[credential] or 0) + tonumber(consumer[2])
  total = total + tonumber(consumer[2])
end
for i = 4, #ARGV do
  if not held[ARGV[i]] then held[ARGV[i]] = 0 end
end
for credential, num in pairs(held) do
  redis.call('HSET', work_key(ARGV[2], credential), 'held', num)
end
for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if #redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1) == 0 then redis.call('SREM', KEYS[2], id) end
end
return total
"""
)

# KEYS: (none). ARGV: counts key prefix, credential key prefix, worker rewards key prefix, INITIAL_ALLOWANCE, max
# leases held by one identity, default max leases of a credential, operator key prefix, '1' when leases are
# earned ('' not), then worker ids.
# `fold` for identities that may not lease again soon (the control loop's live workers): their last groups the
# reward service judged still reach their credential's record.
FOLD = (
    _LIB
    + """
local earn = ARGV[8] ~= ''
for i = 9, #ARGV do
  local worker_id = ARGV[i]
  local credential = credential_of(ARGV[1], worker_id)
  if redis.call('HEXISTS', ARGV[1] .. worker_id, 'credential') == 1 then
    local max_credential = number(redis.call('HGET', ARGV[7] .. credential, 'max_leases'), tonumber(ARGV[6]))
    fold(ARGV[1], ARGV[2], ARGV[3], worker_id, credential, earn, tonumber(ARGV[4]), tonumber(ARGV[5]), max_credential)
  end
end
return 1
"""
)

# Eval tasks (services/coordinator/eval_leases.py): held-out evaluation by the workers. A version's eval tasks are
# the pending entries of `eval_tasks:<version>` in the `rollout` group, leased only to a caller that names that
# version. Their counters (shared/work_counts.py EvalCounter) go to the worker's and the run's hashes only: no
# credential record, allowance, `held` or speculative set is touched, so the rollout accounting stays as it was.
# An eval lease the caller gives back is claimed by EVAL_GIVEN_BACK (idle as if expired): the next caller at the
# version takes it without counting an expiry against anyone.
EVAL_GIVEN_BACK = ":given-back"  # a consumer name no worker id can have (ids are [A-Za-z0-9_-])

# KEYS: eval stream, caller's worker hash, worker leases (zset), caller's counts, totals, work worker ids (set),
#   the version's eval state (hash)
# ARGV: group, caller id, now_s, lease ms, max tasks, max eval leases one worker holds of the version, operator
#   key prefix, operator quarantine key prefix, the given-back consumer name, counts key prefix
# Returns {state} when the caller may not lease (as LEASE), else {'active', entries}: eval leases handed back or
# left past the lease time by others first (counted `eval_expired` for their holder), then new ones.
LEASE_EVAL = """
-- no open evaluation of the version (the common case): nothing to lease, and the training lease checks the caller
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('EXISTS', KEYS[7]) == 0 then return {'active', {}} end
local state = redis.call('HGET', KEYS[2], 'state')
if not state then return {'unknown'} end
local expiry = redis.call('ZSCORE', KEYS[3], ARGV[2])
if (not expiry) or tonumber(expiry) <= tonumber(ARGV[3]) then return {'dead'} end
if state ~= 'active' then return {state} end
local credential = redis.call('HGET', KEYS[2], 'operator_id') or ''
if credential ~= '' and (redis.call('SCARD', ARGV[8] .. credential) > 0
    or (redis.call('HGET', ARGV[7] .. credential, 'quarantine_reason') or '') ~= '') then
  return {'quarantined'}
end
local caller, lease_ms, wanted, max_held = ARGV[2], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local room = math.min(wanted, max_held - #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', max_held, caller))
local entries = {}
if room > 0 then
  for _, p in ipairs(redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', lease_ms, '-', '+', room)) do
    if p[2] ~= caller then
      local claimed = redis.call('XCLAIM', KEYS[1], ARGV[1], caller, lease_ms, p[1])
      if p[2] ~= ARGV[9] then
        redis.call('HINCRBY', ARGV[10] .. p[2], 'eval_expired', 1)
        redis.call('HINCRBY', KEYS[5], 'eval_expired', 1)
      end
      if claimed[1] then entries[#entries + 1] = claimed[1] end
    end
  end
  local fresh = room - #entries
  if fresh > 0 then
    local read = redis.call('XREADGROUP', 'GROUP', ARGV[1], caller, 'COUNT', fresh, 'STREAMS', KEYS[1], '>')
    if read then
      for _, entry in ipairs(read[1][2]) do entries[#entries + 1] = entry end
    end
  end
end
if #entries > 0 then
  redis.call('HINCRBY', KEYS[4], 'eval_leased', #entries)
  redis.call('HINCRBY', KEYS[5], 'eval_leased', #entries)
  redis.call('SADD', KEYS[6], caller)
  redis.call('HSETNX', KEYS[7], 'first_leased_at_s', ARGV[3])
end
return {'active', entries}
"""

# KEYS: eval stream, eval_rollouts, caller's counts, totals, work worker ids (set), caller's worker record, the
#   lease's answered marker
# ARGV: group, caller id, lease id, refusal ('1': refuse, '' accept), payload (the group, or the dead letter of a
#   refusal), the dead letter to write when the lease is not held, "<caller id>:<sha256 of the answer>", the
#   marker's TTL (s), counts key prefix, credential key prefix, how many refusals of one credential are kept
# As ANSWER, for an eval lease: an accepted group goes to `eval_rollouts` and its task is acked; a refusal's dead
# letter goes to the caller's credential's refusals. Counted eval_accepted / eval_refused. Returns as ANSWER.
ANSWER_EVAL = (
    _LIB
    + """
local caller = ARGV[2]
local credential = redis.call('HGET', KEYS[6], 'operator_id') or credential_of(ARGV[9], caller)
local refusals = ARGV[10] .. credential .. ':refusals'
redis.call('SADD', KEYS[5], caller)
local held = false
if redis.call('EXISTS', KEYS[1]) == 1 then
  local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
  held = #pending > 0 and pending[1][2] == caller
end
if not held then
  if redis.call('GET', KEYS[7]) == ARGV[7] then return {1, 'repeat'} end
  redis.call('XADD', refusals, 'MAXLEN', '~', ARGV[11], '*', 'data', ARGV[6])
  redis.call('HINCRBY', KEYS[3], 'eval_refused', 1)
  redis.call('HINCRBY', KEYS[4], 'eval_refused', 1)
  return {0, 'not-held'}
end
if ARGV[4] ~= '' then
  redis.call('XADD', refusals, 'MAXLEN', '~', ARGV[11], '*', 'data', ARGV[5])
  redis.call('HINCRBY', KEYS[3], 'eval_refused', 1)
  redis.call('HINCRBY', KEYS[4], 'eval_refused', 1)
  return {0, 'held'}
end
local id = redis.call('XADD', KEYS[2], '*', 'data', ARGV[5])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('SET', KEYS[7], ARGV[7], 'EX', ARGV[8])
redis.call('HINCRBY', KEYS[3], 'eval_accepted', 1)
redis.call('HINCRBY', KEYS[4], 'eval_accepted', 1)
return {1, id}
"""
)

# KEYS: eval stream, caller's counts, totals. ARGV: group, lease id, caller id, lease ms, the given-back consumer.
# The caller hands an eval lease back (its version moved on, or its engine cannot serve the prompt): claimed by the
# given-back consumer, idle as if expired, so the next caller at the version takes it; counted eval_given_back,
# nothing else. Returns 1 given back, 0 not held by the caller.
GIVE_BACK_EVAL = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #pending == 0 or pending[1][2] ~= ARGV[3] then return 0 end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[5], 0, ARGV[2], 'IDLE', ARGV[4])
redis.call('HINCRBY', KEYS[2], 'eval_given_back', 1)
redis.call('HINCRBY', KEYS[3], 'eval_given_back', 1)
return 1
"""
