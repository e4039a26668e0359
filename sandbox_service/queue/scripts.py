"""The two Lua scripts that change the Redis queue: ``admit`` (API nodes) and ``settle`` (both).

Every change of the job stream goes through one of them, so each is atomic and the depth
counter cannot drift: ``admit`` adds chunks and counts their jobs in; ``settle`` removes one
chunk, counts its jobs out only if it really removed it (``XDEL`` said 1), publishes its
results and puts back whatever has to run again. Key names come in ``KEYS`` from
``queue.keys``; the scripts spell none.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Script:
    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


# KEYS: jobs, depth, epoch, then (result, claim, waiters) per request that has an id.
# ARGV: max_depth, chunk_size, reply, group, claim_ttl_ms, n, epoch_token, then
#       (key, id_slot, body) per job; id_slot is 0 for a request without id, else which triple
#       of KEYS is its.
# Returns {'full', depth, epoch, fresh} or {'ok', depth, epoch, kind1, value1, ...,
# chunk_id1, ...} where epoch is the epoch before this call (nil: this call set it) and kind
# is 'r' (stored result: value), 'j' (running: value is its job key) or 'c' (queued in chunk
# number value).
ADMIT = Script(
    "admit",
    """
local max_depth, chunk_size = tonumber(ARGV[1]), tonumber(ARGV[2])
local reply, group, claim_ttl, n = ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6])
local epoch = redis.call('SET', KEYS[3], ARGV[7], 'NX', 'GET')
local out, fresh = {'ok', 0, epoch}, {}
for i = 1, n do
  local slot = tonumber(ARGV[6 + 3 * i])
  local kind, value = 'c', ''
  if slot > 0 then
    local k = 3 + 3 * (slot - 1)
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
for i = 1, n do
  local slot = tonumber(ARGV[6 + 3 * i])
  if slot > 0 then
    local k = 3 + 3 * (slot - 1)
    if out[2 * i + 2] == 'j' then
      redis.call('SADD', KEYS[k + 3], reply)
      redis.call('PEXPIRE', KEYS[k + 3], claim_ttl)
    elseif out[2 * i + 2] == 'c' then
      redis.call('SET', KEYS[k + 2], ARGV[5 + 3 * i], 'PX', claim_ttl)
    end
  end
end
out[2] = depth + #fresh
if #fresh == 0 then return out end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[1], group, '0', 'MKSTREAM')
end
redis.call('INCRBY', KEYS[2], #fresh)
local chunks = math.ceil(#fresh / chunk_size)
local per, extra, m = math.floor(#fresh / chunks), #fresh % chunks, 1
for c = 1, chunks do
  local size = per
  if c <= extra then size = size + 1 end
  local bodies = {}
  for _ = 1, size do
    local i = fresh[m]
    bodies[#bodies + 1] = ARGV[7 + 3 * i]
    out[2 * i + 3] = c
    m = m + 1
  end
  out[#out + 1] = redis.call('XADD', KEYS[1], '*', 'n', size, 'reply', reply,
                             'jobs', '[' .. table.concat(bodies, ',') .. ']')
end
return out
""",
)

# KEYS: jobs, depth, reply, then (result, claim, waiters) per result whose request has an id.
# ARGV: group, chunk_id, n, only_if_undelivered, reply_maxlen, result_ttl_ms, n_results,
#       (key, id_slot, cache, body) per result, n_requeue, (count, jobs_json) per new chunk.
# Returns 1 if this call removed the chunk, 0 if it was gone already (its results are still
# published: a worker that was presumed dead may finish first), -1 if only_if_undelivered and
# a worker holds it (nothing done).
SETTLE = Script(
    "settle",
    """
local jobs, depth, reply = KEYS[1], KEYS[2], KEYS[3]
local group, chunk, n = ARGV[1], ARGV[2], tonumber(ARGV[3])
if ARGV[4] == '1' then
  local held = redis.pcall('XPENDING', jobs, group, chunk, chunk, 1)
  if type(held) == 'table' and held.err == nil and #held > 0 then return -1 end
end
redis.pcall('XACK', jobs, group, chunk)
local removed = redis.call('XDEL', jobs, chunk)
if removed == 1 then
  if redis.call('DECRBY', depth, n) < 0 then redis.call('SET', depth, 0) end
elseif ARGV[4] == '1' then
  return 0
end
local a, fields = 8, {}
for _ = 1, tonumber(ARGV[7]) do
  local key, slot, cache, body = ARGV[a], tonumber(ARGV[a + 1]), ARGV[a + 2], ARGV[a + 3]
  a = a + 4
  fields[#fields + 1] = key
  fields[#fields + 1] = body
  if slot > 0 then
    local k = 3 + 3 * (slot - 1)
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
if removed == 1 then
  for r = 1, requeue do
    local count, body = ARGV[a + 2 * r - 1], ARGV[a + 2 * r]
    redis.call('XADD', jobs, '*', 'n', count, 'reply', reply, 'jobs', body)
    redis.call('INCRBY', depth, count)
  end
end
return removed
""",
)

SCRIPTS = (ADMIT, SETTLE)
