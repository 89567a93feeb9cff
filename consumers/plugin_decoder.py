"""Plug-in decoders: any record format (Avro, Protobuf, a company envelope) read into a sample dict.

``source.decoder: package.module:attr`` names a factory on the Python path.
Kelp calls it once per source, ``attr(spec, **source.decoder_args)``, with the
:class:`~kelp.config.FeatureSpec`, and calls ``decode(value)`` on what it
returns for every record. ``decode`` returns a JSON-like dict (nested dicts,
lists, numbers, strings, ``None``) that ``source.json`` then maps onto the
features exactly as it maps a JSON object, so batching, validation, the one
id rule and dead letters are those of ``format: json``.

``kelp join`` takes the same plug-ins for action topics
(``join.actions[].decoder``): there the factory's ``spec`` is None and the dict
is read by the action's paths.

A record the decoder cannot read raises :class:`DecodeError` with one of
:data:`~kelp.consumers.codec.REASONS` (``bad_payload``, ``unknown_schema``,
``missing_field``...); a reason not in that tuple is reported as
``bad_payload`` with the decoder's reason at the start of the detail, so
metric labels stay bounded. Any other exception from ``decode`` also
rejects just that record (``bad_payload``): one hostile record must not stop
the trainer, and ``source.max_initial_reject_fraction`` stops a decoder that
rejects everything.

>>> class Upper:
...     def __init__(self, spec, field="name"):
...         self.field = field
...     def decode(self, value):
...         return {self.field: value.decode().upper()}
>>> Upper(None).decode(b"alice")
{'name': 'ALICE'}
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol

from kelp.config import FeatureSpec
from kelp.consumers.codec import REASONS
from kelp.consumers.columns import RejectError
from kelp.consumers.errors import SourceUserError

__all__ = ["DecodeError", "SampleDecoder", "load_decoder", "parse_with"]


class DecodeError(RejectError):
    """A record a decoder cannot read: ``reason`` (one of ``REASONS``) and a one-line ``detail``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason, detail)


class SampleDecoder(Protocol):
    """What ``source.decoder``'s factory returns."""

    def decode(self, value: bytes) -> dict[str, Any]:
        """The sample in one record, as a JSON-like dict; raises :class:`DecodeError` for a bad record."""
        ...


def _resolve(ref: str, where: str) -> Any:
    module_name, _, attr_path = ref.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise SourceUserError(
            f"{where} {ref!r}: cannot import {module_name} ({exc}); is it on the Python path?"
        ) from None
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SourceUserError(f"{where} {ref!r}: {module_name} has no {attr_path}") from None
    return obj


def load_decoder(
    ref: str, spec: FeatureSpec | None, args: dict[str, Any], where: str = "source.decoder"
) -> SampleDecoder:
    """The decoder ``ref`` (``package.module:attr``) made with ``attr(spec, **args)``.

    ``where`` is the config field that named it (``join.actions[0].decoder``
    reads action records, with ``spec`` None). Raises :class:`SourceUserError`
    (one line) when it cannot be imported, refuses its arguments, or has no
    ``decode`` method.
    """
    factory = _resolve(ref, where)
    if not callable(factory):
        raise SourceUserError(f"{where} {ref!r} is a {type(factory).__name__}, not a callable")
    try:
        decoder = factory(spec, **args)
    except (TypeError, ValueError, OSError, KeyError) as exc:
        raise SourceUserError(f"{where}_args for {ref}: {type(exc).__name__}: {exc}") from None
    if not callable(getattr(decoder, "decode", None)):
        raise SourceUserError(f"{where} {ref!r} returned a {type(decoder).__name__} with no decode()")
    return decoder


def parse_with(decoder: SampleDecoder) -> Callable[[bytes], Any]:
    """``decoder.decode`` with its failures turned into :class:`RejectError` with a known reason."""
    decode = decoder.decode
    name = type(decoder).__name__

    def parse(value: bytes) -> Any:
        try:
            sample = decode(value)
        except RejectError as exc:
            if exc.reason in REASONS:
                raise
            raise RejectError("bad_payload", f"{exc.reason}: {exc.detail}"[:500]) from None
        except Exception as exc:  # a decoder bug or a library error on one hostile record
            raise RejectError("bad_payload", f"{name}: {type(exc).__name__}: {exc}"[:500]) from None
        if not isinstance(sample, dict):
            raise RejectError("bad_payload", f"{name} returned a {type(sample).__name__}, expected a dict")
        return sample

    return parse
