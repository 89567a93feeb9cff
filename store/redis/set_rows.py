"""One Lua call writes a chunk of rows with an expiry (or only over existing keys): no per-key commands.

``MSET`` writes a chunk of rows in one command, but it can set neither an
expiry nor ``XX``. Without this script a table with a TTL (or with admission,
whose pushes must not re-create rows) would send one ``SET key value [XX] PX ms``
per row, and redis-py's per-command packing would make a push with a TTL far
slower than one without (docs/performance.md). The script takes the chunk's
keys, the expiry and the values as one ``EVAL`` and returns how many rows it
wrote (``XX`` skips keys that are not stored). All keys of a chunk share a
hash tag, so it runs on one Redis Cluster node as well.
"""

from __future__ import annotations

__all__ = ["SET_ROWS_SCRIPT", "set_rows_args"]

SET_ROWS_SCRIPT = """
local px = tonumber(ARGV[1])
local xx = ARGV[2] == '1'
local written = 0
for i, key in ipairs(KEYS) do
  local reply
  if px > 0 and xx then
    reply = redis.call('SET', key, ARGV[i + 2], 'XX', 'PX', px)
  elseif px > 0 then
    reply = redis.call('SET', key, ARGV[i + 2], 'PX', px)
  elseif xx then
    reply = redis.call('SET', key, ARGV[i + 2], 'XX')
  else
    reply = redis.call('SET', key, ARGV[i + 2])
  end
  if reply then
    written = written + 1
  end
end
return written
"""


def set_rows_args(
    keys: list[bytes], values: list[bytes], px_ms: int, only_existing: bool
) -> tuple[object, ...]:
    """The ``EVAL`` command for one chunk: keys, then expiry (0 = none), the XX flag and the values."""
    return ("EVAL", SET_ROWS_SCRIPT, len(keys), *keys, px_ms, int(only_existing), *values)
