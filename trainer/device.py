"""Resolve the trainer's ``device`` setting to a :class:`torch.device`.

The config accepts ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda``
and ``cuda:N``. Asking for CUDA on a machine without it is an operator
mistake, so it raises :class:`~kelp.errors.UserError` at start-up instead of
failing later inside a kernel.
"""

from __future__ import annotations

import re

import torch

from kelp.errors import UserError

__all__ = ["resolve_device"]

_CUDA_N = re.compile(r"^cuda:(\d+)$")


def resolve_device(setting: str) -> torch.device:
    """``"auto" | "cpu" | "cuda" | "cuda:N"`` -> a usable :class:`torch.device`.

    >>> resolve_device("cpu")
    device(type='cpu')
    """
    if setting == "cpu":
        return torch.device("cpu")
    if setting == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    match = _CUDA_N.match(setting)
    if setting != "cuda" and match is None:
        raise UserError(f"trainer.device {setting!r}: expected auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise UserError(f"trainer.device is {setting!r} but CUDA is not available on this machine")
    if match is not None:
        index = int(match.group(1))
        count = torch.cuda.device_count()
        if index >= count:
            raise UserError(f"trainer.device is {setting!r} but only {count} CUDA device(s) exist")
    return torch.device(setting)
