"""Row-wise Adagrad applied inside Redis, so concurrent trainer ranks' updates to one row compose.

With ``store.sparse_updates: overwrite`` a push writes whole rows: when two
ranks update the same hot row from the same read, the later write drops the
earlier update (``kelp bench scale`` measures how often). With ``compose`` the
trainer sends its gradients and this script updates the *stored* row::

    acc += mean(g * g);   row -= lr * g / (sqrt(acc) + eps)

which is :class:`kelp.trainer.optim.RowWiseAdagrad` (in double precision, stored
as float32). Redis runs a script atomically, so two ranks' calls on one row
serialise and both updates land. One ``EVAL`` carries one chunk of one shard
group's keys (all in one cluster slot: the cluster store's keys of a group
share a hash tag), pipelined with the rest of the push: one round trip per
shard, like ``MSET``.

Where no row is stored, the trainer's own row is written when the table's
admission lets a push create rows, and skipped otherwise (as ``SET XX``).
Where the stored value is no valid finite row (another length, version, dtype
or dim; a NaN or an infinity), the pull quarantined it and the trainer started
from the init row: its own row replaces the value, so the store heals.
Only float32 rows compose (the script reads the row layout of
:mod:`kelp.store.rows.codec`, format version 1); a float16 table's stored row is
replaced by the trainer's row, as ``overwrite`` does.
"""

from __future__ import annotations

__all__ = ["ADAGRAD_SCRIPT", "script_args"]

ADAGRAD_SCRIPT = """
local lr = tonumber(ARGV[1])
local eps = tonumber(ARGV[2])
local dim = tonumber(ARGV[3])
local now = tonumber(ARGV[4])
local px = tonumber(ARGV[5])
local create = ARGV[6] == '1'
local ffmt = '<' .. string.rep('f', dim)
local kept = 0
local function finite(x) return x == x and x ~= math.huge and x ~= -math.huge end
for i, key in ipairs(KEYS) do
  local out = nil
  local stored = redis.call('GET', key)
  local row, version, dtype, d, count, updated, acc
  if stored and #stored == 16 + 4 * dim then
    version, dtype, d, count, updated, acc = struct.unpack('<BBHIIf', stored)
    if version == 1 and dtype == 0 and d == dim and finite(acc) then
      row = {struct.unpack(ffmt, stored, 17)}
      for j = 1, dim do
        if not finite(row[j]) then row = nil; break end
      end
    end
  end
  if row then
    local grad = {struct.unpack(ffmt, ARGV[5 + 2 * i])}
    local g2 = 0
    for j = 1, dim do g2 = g2 + grad[j] * grad[j] end
    acc = acc + g2 / dim
    local denom = math.sqrt(acc) + eps
    for j = 1, dim do row[j] = row[j] - lr * grad[j] / denom end
    local header = struct.pack('<BBHIIf', version, dtype, d, count, now, acc)
    out = header .. struct.pack(ffmt, unpack(row, 1, dim))
  elseif stored or create then
    out = ARGV[6 + 2 * i]
  end
  if out then
    if px > 0 then
      redis.call('SET', key, out, 'PX', px)
    else
      redis.call('SET', key, out)
    end
    kept = kept + 1
  end
end
return kept
"""


def script_args(
    *,
    lr: float,
    eps: float,
    dim: int,
    now: int,
    px_ms: int,
    create: bool,
    grads: list[bytes],
    rows: list[bytes],
) -> list[bytes | int | float]:
    """ARGV of one call: the settings, then per key its gradient (dim float32 LE) and its fallback value."""
    args: list[bytes | int | float] = [repr(lr).encode(), repr(eps).encode(), dim, now, px_ms, int(create)]
    for grad, row in zip(grads, rows, strict=True):
        args += [grad, row]
    return args
