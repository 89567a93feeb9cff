"""The one id rule: how a feature value becomes the uint64 id of its embedding row, in every format.

Every source (msgpack events, CSV and Criteo files, JSON, a plug-in decoder)
and serving apply the same rule, so the id a producer wrote, the id a file
held and the id a client scores all reach the same row:

* an integer in ``[0, 2**64)`` is that id (bools, negatives, larger ints and
  floats are not ids: ``bad_id``);
* a string of ASCII digits only whose value is below ``2**64`` is that integer
  (``"258029"`` and ``258029`` are one id; leading zeros do not matter);
* any other string is the xxh3-64 hash (seed 0) of its UTF-8 bytes
  (:func:`~kelp.consumers.codec.hash_str_id`): ``"alice"``, ``"-3"``,
  ``"12.0"``, ``"0x1f"``, ``""``.

A hashed string can collide with a numeric id; with 64-bit ids that is as
rare as any two strings colliding. Every string has an id, however long; the
only str without one is text that is not valid Unicode (a lone surrogate,
which only a lenient JSON parser produces): it has no UTF-8 bytes to hash and
raises ``UnicodeEncodeError`` (a ``ValueError``).

>>> [id_of(v) for v in (7, "7", "007")]
[7, 7, 7]
>>> id_of("alice") == hash_str_id("alice")
True
>>> id_of(str(2**64)) == hash_str_id(str(2**64))  # beyond uint64: a string like any other
True
"""

from __future__ import annotations

from kelp.consumers.codec import hash_str_id

__all__ = ["MAX_ID", "digits_id", "id_of", "str_id"]

MAX_ID = 2**64 - 1
_MAX_DIGITS = len(str(MAX_ID))  # longer digit strings are past uint64 (and may be past int()'s digit limit)


def digits_id(value: str) -> int | None:
    """The integer a string of ASCII digits below ``2**64`` is; None for any other string.

    Never calls ``int()`` on more digits than a uint64 has, so a cell of thousands of
    digits is a string id, not an error from Python's integer-string limit.

    >>> digits_id("0" * 5000 + "5"), digits_id("9" * 5000), digits_id("-3")
    (5, None, None)
    """
    if not (value.isascii() and value.isdigit()):
        return None
    significant = value.lstrip("0")
    if len(significant) > _MAX_DIGITS:
        return None
    number = int(significant) if significant else 0
    return number if number <= MAX_ID else None


def str_id(value: str) -> int:
    """The id of a string (see the module docstring): its integer when it is one, else its hash.

    >>> str_id("0" * 30 + "5"), str_id("9" * 5000) == hash_str_id("9" * 5000)
    (5, True)
    """
    number = digits_id(value)
    return hash_str_id(value) if number is None else number


def id_of(value: int | str) -> int:
    """The id of one feature value. Raises ``ValueError`` for a value that is no id (see the module)."""
    if type(value) is int:  # not bool, not a float
        if 0 <= value <= MAX_ID:
            return value
        raise ValueError(f"id {value} is outside [0, 2**64)")
    if type(value) is str:
        return str_id(value)
    raise ValueError(f"{type(value).__name__} is not an id (expected an integer or a string)")
