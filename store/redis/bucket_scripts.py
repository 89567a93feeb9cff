"""The Lua scripts of the ``buckets`` row layout: conditional writes and the TTL sweep.

In the ``buckets`` layout (:mod:`kelp.store.redis.buckets`) a row is a field of a
hash, and hash fields have no expiry of their own on Redis 7.0. A row's TTL is
therefore read from its value: bytes 8..11 of every row (:mod:`kelp.store.rows.codec`)
hold its last update in unix seconds, and a row older than the table's TTL is
*expired*: reads treat it as absent, these scripts treat it as absent, and the
sweep deletes it. Plain pushes need no script (``HSET`` per row, packed by
numpy); a script is needed only where a write depends on what is stored:

* :data:`SET_ROWS_IF`: ``mode`` ``nx`` stores an admitted id's init row unless a
  live row is there (a concurrent admission or a newer row wins, as ``SET NX``);
  ``xx`` overwrites only live rows (a push must not re-create a row that was
  evicted or expired, as ``SET XX``). A stored value of another length than the
  new one is no row (the store quarantines it on read) and is overwritten in
  either mode, so the store heals. Returns how many rows it wrote.
* :data:`SWEEP`: deletes the expired rows of the given buckets; returns how many.
  A key that is not a hash is left alone (reads and writes of its ids name it in
  their error).

Every key of one call lives on one shard (the standalone store routes whole
buckets to shards).
"""

from __future__ import annotations

__all__ = ["SET_ROWS_IF", "SWEEP", "set_rows_if_args", "sweep_args"]

SET_ROWS_IF = """
local xx = ARGV[1] == 'xx'
local cutoff = tonumber(ARGV[2])
local written = 0
for i, key in ipairs(KEYS) do
  local field = ARGV[2 * i + 1]
  local value = ARGV[2 * i + 2]
  local old = redis.call('HGET', key, field)
  local broken = old and #old ~= #value
  local live = old and not broken and (cutoff == 0 or struct.unpack('<I4', old, 9) >= cutoff)
  if old and not live and not broken then
    redis.call('HDEL', key, field)
  end
  if broken or (xx and live) or (not xx and not live) then
    redis.call('HSET', key, field, value)
    written = written + 1
  end
end
return written
"""

SWEEP = """
local cutoff = tonumber(ARGV[1])
local removed = 0
for _, key in ipairs(KEYS) do
  local all = {}
  if redis.call('TYPE', key).ok == 'hash' then
    all = redis.call('HGETALL', key)
  end
  local dead = {}
  for j = 1, #all, 2 do
    local value = all[j + 1]
    if #value >= 12 and struct.unpack('<I4', value, 9) < cutoff then
      dead[#dead + 1] = all[j]
    end
  end
  for j = 1, #dead, 512 do
    removed = removed + redis.call('HDEL', key, unpack(dead, j, math.min(j + 511, #dead)))
  end
end
return removed
"""


def set_rows_if_args(
    keys: list[bytes], fields: list[bytes], values: list[bytes], only_live: bool, cutoff_s: int
) -> tuple[object, ...]:
    """``EVAL`` of :data:`SET_ROWS_IF`: ``only_live`` is ``xx`` (else ``nx``); ``cutoff_s`` the unix
    second before which a row is expired (0: the table has no TTL)."""
    args: list[object] = ["xx" if only_live else "nx", cutoff_s]
    for field, value in zip(fields, values, strict=True):
        args += [field, value]
    return ("EVAL", SET_ROWS_IF, len(keys), *keys, *args)


def sweep_args(keys: list[bytes], cutoff_s: int) -> tuple[object, ...]:
    """``EVAL`` of :data:`SWEEP` over bucket ``keys``: delete rows updated before ``cutoff_s``."""
    return ("EVAL", SWEEP, len(keys), *keys, cutoff_s)
