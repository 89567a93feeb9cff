"""Arrays as Kelp's native functions take them: C-contiguous and aligned for their dtype.

``np.ascontiguousarray`` keeps a contiguous view as it is, even one that
starts at an odd byte (ids decoded with ``np.frombuffer`` from the middle of
a Kafka message), and the native code (``kelp_native``) refuses a uint64
buffer that is not 8-byte aligned. This copies only where needed.

>>> raw = np.frombuffer(bytes(17), dtype=np.uint64, count=2, offset=1)
>>> raw.flags.aligned, native_array(raw, np.uint64).flags.aligned
(False, True)
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["native_array"]


def native_array(values: Any, dtype: Any) -> np.ndarray:
    """``values`` as a C-contiguous, aligned array of ``dtype`` (no copy when it is one already)."""
    return np.require(values, dtype=dtype, requirements=("C", "A"))
