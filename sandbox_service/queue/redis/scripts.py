"""The Lua scripts that change the Redis queue: ``admit`` (API nodes), ``take`` (workers) and
``settle`` (both).

Every change of the job stream goes through one of them, so each is atomic and the depth
counters cannot drift: ``admit`` adds chunks, counts their jobs in (the deployment's depth and
their tenant's) and lines them up in their tenant's ready list; ``take`` hands a worker the
next chunk of the tenant whose turn it is (``queue.fair``'s arithmetic); ``settle`` removes one
chunk, counts its jobs out only if it really removed it (``XDEL`` said 1), corrects its
tenant's virtual time by what the chunk really took, publishes its results and puts back
whatever has to run again, at the head of its tenant's list. Key names come in ``KEYS`` from
``queue.redis.keys``, but for the fields of the ``fair`` hash, which carry tenant names.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

WAKE_MAX = 1024  # tokens the bell keeps at most: a backlog wakes every idle worker anyway


@dataclass(frozen=True)
class Script:
    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        source = self.source.replace("WAKE_MAX", str(WAKE_MAX))
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "sha", hashlib.sha1(source.encode()).hexdigest())


# KEYS: jobs, depth, epoch, fair, active, bell, ready (of this tenant), then (result, claim,
#       waiters) per request that has an id.
# ARGV: max_depth, chunk_size, reply, group, claim_ttl_ms, n, epoch_token, tenant, weight,
#       max_in_flight, max_queued, then (key, id_slot, body) per job; id_slot is 0 for a request
#       without id, else which triple of KEYS is its.
# Returns {'full', depth, epoch, fresh}, {'quota', queued, epoch, fresh} (the tenant's
# max_queued) or {'ok', depth, epoch, kind1, value1, ..., chunk_id1, ...} where epoch is the
# epoch before this call (nil: this call set it) and kind is 'r' (stored result: value), 'j'
# (running: value is its job key) or 'c' (queued in chunk number value).
ADMIT = Script(
    "admit",
    """
local max_depth, chunk_size = tonumber(ARGV[1]), tonumber(ARGV[2])
local reply, group, claim_ttl, n = ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6])
local tenant, max_queued = ARGV[8], tonumber(ARGV[11])
local fair, active, bell, ready = KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local epoch = redis.call('SET', KEYS[3], ARGV[7], 'NX', 'GET')
local out, fresh = {'ok', 0, epoch}, {}
for i = 1, n do
  local slot = tonumber(ARGV[10 + 3 * i])
  local kind, value = 'c', ''
  if slot > 0 then
    local k = 7 + 3 * (slot - 1)
    local stored = redis.call('GET', KEYS[k + 1])
    if stored then
      kind, value = 'r', stored
    else
      local owner = redis.call('GET', KEYS[k + 2])
      if owner then kind, value = 'j', owner end
    end
  end
  out[2 * i + 2], out[2 * i + 3] = kind, value
  if kind == 'c' then fresh[#fresh + 1] = i end
end
local depth = tonumber(redis.call('GET', KEYS[2]) or '0')
if #fresh > 0 and depth + #fresh > max_depth then return {'full', depth, epoch, #fresh} end
local queued = tonumber(redis.call('HGET', fair, 'queued:' .. tenant) or '0')
if #fresh > 0 and max_queued > 0 and queued + #fresh > max_queued then
  return {'quota', queued, epoch, #fresh}
end
for i = 1, n do
  local slot = tonumber(ARGV[10 + 3 * i])
  if slot > 0 then
    local k = 7 + 3 * (slot - 1)
    if out[2 * i + 2] == 'j' then
      redis.call('SADD', KEYS[k + 3], reply)
      redis.call('PEXPIRE', KEYS[k + 3], claim_ttl)
    elseif out[2 * i + 2] == 'c' then
      redis.call('SET', KEYS[k + 2], ARGV[9 + 3 * i], 'PX', claim_ttl)
    end
  end
end
out[2] = depth + #fresh
if #fresh == 0 then return out end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[1], group, '0', 'MKSTREAM')
end
redis.call('INCRBY', KEYS[2], #fresh)
redis.call('HINCRBY', fair, 'queued:' .. tenant, #fresh)
redis.call('HSET', fair, 'weight:' .. tenant, ARGV[9], 'cap:' .. tenant, ARGV[10])
local chunks = math.ceil(#fresh / chunk_size)
local per, extra, m = math.floor(#fresh / chunks), #fresh % chunks, 1
for c = 1, chunks do
  local size = per
  if c <= extra then size = size + 1 end
  local bodies = {}
  for _ = 1, size do
    local i = fresh[m]
    bodies[#bodies + 1] = ARGV[11 + 3 * i]
    out[2 * i + 3] = c
    m = m + 1
  end
  local id = redis.call('XADD', KEYS[1], '*', 'n', size, 'reply', reply, 'tenant', tenant,
                        'jobs', '[' .. table.concat(bodies, ',') .. ']')
  redis.call('RPUSH', ready, size .. '|' .. id)
  out[#out + 1] = id
end
if not redis.call('ZSCORE', active, tenant) then
  local vtime = tonumber(redis.call('HGET', fair, 'vtime:' .. tenant) or '0')
  local clock = tonumber(redis.call('HGET', fair, 'clock') or '0')
  redis.call('ZADD', active, math.max(vtime, clock), tenant)
end
local tokens = {}
for c = 1, chunks do tokens[c] = '1' end
redis.call('RPUSH', bell, unpack(tokens))
redis.call('LTRIM', bell, -WAKE_MAX, -1)
return out
""",
)

# The weighted fair choice of queue.fair, in Redis, so that every worker shares one clock.
# KEYS: jobs, fair, active, bell, the worker's woke list, then the ready list of each tenant
#       the worker knows of.
# ARGV: group, consumer, known, then the known tenants' names (in the order of their lists),
#       then the mean run time to charge a tenant not yet measured.
# Returns {'chunk', entry id, fields, estimate}: the chunk, now in this consumer's pending list
# (XCLAIM FORCE: no reader uses XREADGROUP, so the group's own order is never used);
# {'tenants', name, ...}: a tenant with work the worker did not name (it calls again with all of
# them); or {'empty'}: nothing it may take, wait on the bell. The worker waits with
# ``BLMOVE bell woke`` followed, in the same round trip, by this script (Redis runs a client's
# commands in order, so it runs the moment the wait ends): a token in the woke list means the
# worker was woken by one (it is dropped here); without one, a chunk taken removes a token of
# the bell, so that the bell holds about one per chunk no worker took and wakes one worker per
# chunk, not every idle one.
TAKE = Script(
    "take",
    """
local jobs, fair, active, bell = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, consumer, known = ARGV[1], ARGV[2], tonumber(ARGV[3])
local initial = tonumber(ARGV[4 + known])
local index = {}
for i = 1, known do index[ARGV[3 + i]] = 5 + i end
local order = redis.call('ZRANGE', active, 0, -1, 'WITHSCORES')
for o = 1, #order, 2 do
  if index[order[o]] == nil then
    return {'tenants', unpack(redis.call('ZRANGE', active, 0, -1))}
  end
end
local woken = redis.call('LPOP', KEYS[5])
for o = 1, #order, 2 do
  local t, vtime = order[o], tonumber(order[o + 1])
  local ready = KEYS[index[t]]
  local cap = tonumber(redis.call('HGET', fair, 'cap:' .. t) or '0')
  local running = tonumber(redis.call('HGET', fair, 'running:' .. t) or '0')
  while true do
    local head = redis.call('LINDEX', ready, 0)
    if not head then
      redis.call('ZREM', active, t)
      break
    end
    local bar = string.find(head, '|', 1, true)
    local n, id = tonumber(string.sub(head, 1, bar - 1)), string.sub(head, bar + 1)
    if cap > 0 and running > 0 and running + n > cap then break end
    redis.call('LPOP', ready)
    local got = redis.call('XCLAIM', jobs, group, consumer, 0, id, 'FORCE')
    if #got > 0 then
      local weight = tonumber(redis.call('HGET', fair, 'weight:' .. t) or '1')
      local mean = tonumber(redis.call('HGET', fair, 'mean:' .. t) or initial)
      local estimate = n * mean
      redis.call('HSET', fair, 'clock', tostring(vtime), 'vtime:' .. t,
                 tostring(vtime + estimate / weight))
      redis.call('HINCRBY', fair, 'running:' .. t, n)
      if redis.call('LLEN', ready) > 0 then
        redis.call('ZADD', active, tostring(vtime + estimate / weight), t)
      else
        redis.call('ZREM', active, t)
      end
      if not woken then redis.call('LPOP', bell) end
      return {'chunk', got[1][1], got[1][2], tostring(estimate)}
    end
  end
end
return {'empty'}
""",
)

# KEYS: jobs, depth, reply, fair, active, bell, ready (of the chunk's tenant), then (result,
#       claim, waiters) per result whose request has an id.
# ARGV: group, chunk_id, n, only_if_undelivered, reply_maxlen, result_ttl_ms, tenant, held,
#       estimate, took, ran, n_results, (key, id_slot, cache, body) per result, n_requeue,
#       (count, jobs_json) per new chunk. ``held``: a worker took the chunk (it counted in the
#       tenant's running jobs); ``estimate``: what ``take`` charged it; ``took``: the slot-seconds
#       its ``ran`` jobs used, to correct the tenant's virtual time and mean.
# Returns 1 if this call removed the chunk, 0 if it was gone already (its results are still
# published: a worker that was presumed dead may finish first), -1 if only_if_undelivered and
# a worker holds it (nothing done).
SETTLE = Script(
    "settle",
    """
local jobs, depth, reply = KEYS[1], KEYS[2], KEYS[3]
local fair, active, bell, ready = KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local group, chunk, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
local tenant, held = ARGV[7], ARGV[8] == '1'
if ARGV[4] == '1' then
  local pending = redis.pcall('XPENDING', jobs, group, chunk, chunk, 1)
  if type(pending) == 'table' and pending.err == nil and #pending > 0 then return -1 end
end
redis.pcall('XACK', jobs, group, chunk)
local removed = redis.call('XDEL', jobs, chunk)
if removed == 1 then
  if redis.call('DECRBY', depth, n) < 0 then redis.call('SET', depth, 0) end
  if redis.call('HINCRBY', fair, 'queued:' .. tenant, -n) < 0 then
    redis.call('HSET', fair, 'queued:' .. tenant, 0)
  end
  if held then
    if redis.call('HINCRBY', fair, 'running:' .. tenant, -n) < 0 then
      redis.call('HSET', fair, 'running:' .. tenant, 0)
    end
    local ran, took, estimate = tonumber(ARGV[11]), tonumber(ARGV[10]), tonumber(ARGV[9])
    if took ~= estimate then
      local weight = tonumber(redis.call('HGET', fair, 'weight:' .. tenant) or '1')
      local vtime = tonumber(redis.call('HGET', fair, 'vtime:' .. tenant) or '0')
      vtime = vtime + (took - estimate) / weight
      redis.call('HSET', fair, 'vtime:' .. tenant, tostring(vtime))
      redis.call('ZADD', active, 'XX', tostring(vtime), tenant)
    end
    if ran > 0 then
      local mean = tonumber(redis.call('HGET', fair, 'mean:' .. tenant) or tostring(took / ran))
      redis.call('HSET', fair, 'mean:' .. tenant, tostring(mean + 0.2 * (took / ran - mean)))
    end
    local cap = tonumber(redis.call('HGET', fair, 'cap:' .. tenant) or '0')
    if cap > 0 and redis.call('LLEN', ready) > 0 then
      redis.call('RPUSH', bell, '1')
      redis.call('LTRIM', bell, -WAKE_MAX, -1)
    end
  else
    redis.call('LREM', ready, 1, n .. '|' .. chunk)
    if redis.call('LLEN', ready) == 0 then redis.call('ZREM', active, tenant) end
  end
elseif ARGV[4] == '1' then
  return 0
end
local a, fields = 13, {}
for _ = 1, tonumber(ARGV[12]) do
  local key, slot, cache, body = ARGV[a], tonumber(ARGV[a + 1]), ARGV[a + 2], ARGV[a + 3]
  a = a + 4
  fields[#fields + 1] = key
  fields[#fields + 1] = body
  if slot > 0 then
    local k = 7 + 3 * (slot - 1)
    if cache == '1' then redis.call('SET', KEYS[k + 1], body, 'PX', ARGV[6], 'NX') end
    for _, waiter in ipairs(redis.call('SMEMBERS', KEYS[k + 3])) do
      redis.call('XADD', waiter, 'MAXLEN', '~', ARGV[5], '*', key, body)
    end
    redis.call('DEL', KEYS[k + 2], KEYS[k + 3])
  end
end
if #fields > 0 then
  redis.call('XADD', reply, 'MAXLEN', '~', ARGV[5], '*', unpack(fields))
end
local requeue = tonumber(ARGV[a])
if removed == 1 and requeue > 0 then
  local ids = {}
  for r = 1, requeue do
    local count, body = ARGV[a + 2 * r - 1], ARGV[a + 2 * r]
    ids[r] = count .. '|' .. redis.call('XADD', jobs, '*', 'n', count, 'reply', reply,
                                        'tenant', tenant, 'jobs', body)
    redis.call('INCRBY', depth, count)
    redis.call('HINCRBY', fair, 'queued:' .. tenant, count)
  end
  for r = requeue, 1, -1 do redis.call('LPUSH', ready, ids[r]) end
  if not redis.call('ZSCORE', active, tenant) then
    local vtime = tonumber(redis.call('HGET', fair, 'vtime:' .. tenant) or '0')
    local clock = tonumber(redis.call('HGET', fair, 'clock') or '0')
    redis.call('ZADD', active, math.max(vtime, clock), tenant)
  end
  for _ = 1, requeue do redis.call('RPUSH', bell, '1') end
  redis.call('LTRIM', bell, -WAKE_MAX, -1)
end
return removed
""",
)

SCRIPTS = (ADMIT, TAKE, SETTLE)
