"""Finiteness checks: a NaN or an infinity never trains, never gets written, never gets published.

One NaN is contagious: a non-finite row or feature makes the loss NaN, its
gradient makes every dense parameter NaN at the next optimizer step, and a
checkpoint or a snapshot then carries it to every restart and every replica.
The guards here stop it at each door:

* :func:`step_verdict`: before any update, is this step's loss finite, and is
  every gradient it would apply (dense parameters and embedding rows)? One
  fused reduction on the device and a single device-to-host copy, so a step
  pays one sync for it, on CPU or CUDA alike;
* :func:`first_nonfinite`: the name of the first tensor of a checkpoint or a
  snapshot that holds a NaN or an infinity (None when all are finite);
* :class:`SkipLog`: counts skipped steps by reason and warns at most once per
  interval, so a diverged model does not flood the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

import torch
from torch import Tensor

from kelp.errors import KelpError

__all__ = [
    "SKIP_REASONS",
    "NonFiniteError",
    "SkipLog",
    "first_nonfinite",
    "grads_finite",
    "step_verdict",
]

log = logging.getLogger("kelp.train")

SKIP_REASONS: tuple[str, ...] = ("nonfinite_loss", "nonfinite_grad")
"""Every value of the ``reason`` label of ``kelp_trainer_steps_skipped_total``."""


class NonFiniteError(KelpError):
    """A tensor that must be finite holds NaN or an infinity; ``tensor`` names the first one.

    Refusing is the safe answer: a checkpoint or snapshot with one NaN poisons
    every process that loads it. Not retriable: the same weights fail again.
    """

    def __init__(self, what: str, tensor: str) -> None:
        super().__init__(f"{what}: tensor {tensor!r} holds a non-finite value (NaN or infinity)")
        self.tensor = tensor


def step_verdict(loss: Tensor, grads: Iterable[Tensor | None]) -> str | None:
    """None when ``loss`` and every gradient are finite, else the skip reason (:data:`SKIP_REASONS`).

    ``loss``: a 0-dim tensor; ``grads``: the gradients the step would apply
    (None and empty ones are ignored), all on ``loss``'s device. The two flags
    cross to the host together: one sync per step.
    """
    present = [g.detach() for g in grads if g is not None and g.numel() > 0]
    flags = [torch.isfinite(loss.detach()).reshape(())]
    if present:
        flags.append(grads_finite(present))
    verdict = torch.stack(flags).tolist()
    if not verdict[0]:
        return "nonfinite_loss"
    if not all(verdict):
        return "nonfinite_grad"
    return None


def grads_finite(grads: list[Tensor]) -> Tensor:
    """A 0-dim bool tensor on the gradients' device: True when none holds a NaN or an infinity.

    Exact either way, and no host sync. On CUDA, one fused ``_foreach_norm``
    of the infinity norm (max of absolute values: it never overflows, and it is
    non-finite exactly when the gradient is). Elsewhere, where that norm is a
    slow per-tensor loop, each gradient's sum in float64: a NaN or an infinity
    propagates into it, and float32 values cannot overflow a float64 sum.
    """
    if grads[0].device.type == "cuda":
        norms = torch._foreach_norm(grads, float("inf"))
        return torch.isfinite(torch.stack(norms)).all()
    sums = torch.stack([g.sum(dtype=torch.float64) for g in grads])
    return torch.isfinite(sums.sum())


def first_nonfinite(tensors: Mapping[str, Tensor]) -> str | None:
    """The name of the first floating-point tensor (in ``tensors`` order) holding NaN or inf, else None.

    One reduction per tensor, and one host copy per device the tensors are on
    (not one per tensor). Integer tensors are always finite and are skipped.

    >>> first_nonfinite({"a": torch.ones(2), "b": torch.tensor([1.0, float("nan")])})
    'b'
    >>> first_nonfinite({"a": torch.ones(2), "step": torch.tensor(3)}) is None
    True
    """
    names = [k for k, t in tensors.items() if t.is_floating_point() or t.is_complex()]
    by_device: dict[torch.device, list[str]] = {}
    for name in names:
        by_device.setdefault(tensors[name].device, []).append(name)
    bad: set[str] = set()
    for keys in by_device.values():
        finite = torch.stack([torch.isfinite(tensors[k].detach()).all() for k in keys]).tolist()
        bad.update(k for k, ok in zip(keys, finite, strict=True) if not ok)
    return next((name for name in names if name in bad), None)


class SkipLog:
    """Skipped steps by reason, with a WARNING at the first skip and then at most every ``interval_s``.

    Each warning says how many steps were skipped since the previous one, so a
    model that diverged for good shows up as one line a minute, not one a step.
    """

    def __init__(self, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.counts: dict[str, int] = {}
        self._clock = clock
        self._last_warning: float | None = None
        self._since_warning = 0

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def record(self, reason: str, loss: float, samples: int) -> None:
        """Count one skipped step of ``samples`` samples; warn if the interval allows."""
        self.counts[reason] = self.counts.get(reason, 0) + 1
        self._since_warning += 1
        now = self._clock()
        if self._last_warning is not None and now - self._last_warning < self.interval_s:
            return
        log.warning(
            "skipped a training step (%s, loss %s, %d samples): no dense update, no row pushed, its samples "
            "left out of AUC/log loss; %d skipped since the last warning, %d in all",
            reason,
            loss,
            samples,
            self._since_warning,
            self.total,
        )
        self._last_warning = now
        self._since_warning = 0
