"""``join``: the joiner that turns served requests and later actions into labelled training events.

``kelp join`` reads an impressions topic (the serving request log, or any
topic of event-v1 messages carrying a ``request`` map with an ``id``) and one
action topic per kind of action (click, purchase, ...), and writes labelled
events to the topic ``kelp train`` reads. The semantics (windows on event
time, the watermark, late and early actions, negative down-sampling) are in
docs/join.md.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, field_validator, model_validator

from kelp.config.base import StrictModel, decoder_ref, kafka_topic, url_with_plain_userinfo
from kelp.config.json_mapping import TimeCast

__all__ = ["ActionStream", "JoinConfig"]


class ActionStream(StrictModel):
    """One action topic: which task its records are positives for, within which window, matched by what.

    Each field is a dotted path into the action (``event.request.id``). The
    event time is epoch seconds unless ``casts`` declares its form
    (``casts: {ts: iso8601}``, as in ``source.json.casts``); a ``decoder``
    reads records of any other format into the dict these paths read.
    """

    topic: str = Field(description="The Kafka topic of the actions (JSON objects or msgpack maps).")
    task: str = Field(description="The task (a label of features.labels) an action here is a positive for.")
    window_s: float = Field(
        gt=0,
        allow_inf_nan=False,
        description="Attribution window: an action at most this many seconds (event time) after its "
        "impression makes a positive; an impression with none by then is a negative for the task.",
    )
    format: Literal["json", "msgpack"] = Field(
        "json", description="How the action records are written (not with a decoder)."
    )
    decoder: str | None = Field(
        None,
        description="A plug-in decoder for any other format, package.module:attr on the Python path: "
        "attr(None, **decoder_args) returns an object whose decode(value) -> dict gives the action the "
        "paths below read (the source.decoder contract; the spec argument is None for actions).",
    )
    decoder_args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the decoder (a schema, a path...)."
    )
    request_id_field: str = Field(
        "request_id", min_length=1, description="Dotted path of the served request's id in an action."
    )
    item_field: str | None = Field(
        None,
        description="Dotted path of the acted-on item's id; it matches the candidates whose "
        "join.item_feature id is that id. None: the action applies to every candidate of the request.",
    )
    ts_field: str | None = Field(
        "ts",
        description="Dotted path of the action's event time (epoch seconds unless casts says otherwise). "
        "None: the Kafka record's timestamp.",
    )
    casts: dict[str, TimeCast] = Field(
        default_factory=dict,
        description="ts_field -> how its time is written: seconds or milliseconds (epoch, a number or "
        "numeric string), iso8601 (a string with a zone: Z or +hh:mm) or iso8601_utc (a zone-less time "
        "read as UTC). A value its cast cannot read is dead-lettered as bad_type.",
    )

    _decoder = field_validator("decoder")(decoder_ref)

    @field_validator("topic")
    @classmethod
    def _topic(cls, value: str) -> str:
        return kafka_topic(value)

    @model_validator(mode="after")
    def _decoder_and_casts(self) -> Self:
        if self.decoder is not None and "format" in self.model_fields_set:
            raise ValueError("decoder and format exclude each other: the decoder reads the records")
        if self.decoder is None and self.decoder_args:
            raise ValueError("decoder_args given without a decoder")
        for path in self.casts:
            if path != self.ts_field:
                raise ValueError(
                    f"casts.{path}: only the event time (ts_field {self.ts_field!r}) takes a cast; request "
                    "and item ids are read as they are (strings or integers)"
                )
        return self


class JoinConfig(StrictModel):
    """``join``: inputs, output, windows and the waiting store of ``kelp join``."""

    impressions_topic: str = Field(
        "kelp-requests",
        description="The served requests: serving.request_log's topic, or any topic of event-v1 messages "
        "with a request map holding the request's id.",
    )
    actions: list[ActionStream] = Field(
        default_factory=list, description="One entry per action topic; each task needs at least one."
    )
    output_topic: str | None = Field(
        None, description="Where labelled events go. None: the source's first topic (what kelp train reads)."
    )
    group_id: str = Field("kelp-join", min_length=1, description="The joiner's consumer group.")
    item_feature: str | None = Field(
        None,
        description="The sparse feature whose id names a candidate of a request; needed by actions with "
        "an item_field.",
    )
    allowed_lateness_s: float = Field(
        5.0,
        ge=0,
        allow_inf_nan=False,
        description="How far behind the newest event time an input may run: the watermark is the "
        "slowest input partition's newest event time minus this.",
    )
    action_grace_s: float = Field(
        60.0,
        ge=0,
        allow_inf_nan=False,
        description="How long (event time, past the action's own time) an action whose impression has "
        "not arrived waits for it before it is counted as an orphan.",
    )
    late_horizon_s: float = Field(
        3600.0,
        ge=0,
        allow_inf_nan=False,
        description="How long an impression is kept after its windows closed, so an action that arrives "
        "late can still be matched (see late_actions).",
    )
    late_actions: Literal["correct", "drop"] = Field(
        "correct",
        description="An action inside its window that arrives after the window's negative was emitted. "
        "correct: emit the sample again as a positive, flagged late (docs/join.md). drop: count it only.",
    )
    negative_keep_rate: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Share of negatives (samples with every label 0) emitted; each kept one weighs "
        "1/rate, so the trainer's loss stays unbiased. The choice hashes the sample id, so a replay "
        "keeps the same ones.",
    )
    idle_partition_s: float = Field(
        10.0,
        gt=0,
        allow_inf_nan=False,
        description="An input partition that is caught up and gave no record for this long stops "
        "holding the watermark back.",
    )
    max_future_skew_s: float = Field(
        300.0,
        ge=0,
        le=86_400,
        allow_inf_nan=False,
        description="How far past the joiner's wall clock an event time may be (producers' clock skew). "
        "A later one is dead-lettered as future_ts and never moves the watermark: one far-future time "
        "would otherwise close every window at once. It also bounds how long state may live in Redis.",
    )
    advance_when_idle: bool = Field(
        True,
        description="When every input partition is idle, the watermark follows the wall clock (minus "
        "allowed_lateness_s), so windows close on a quiet stream. False: windows wait for new events.",
    )
    redis_url: str | None = Field(
        None,
        description="Redis of the waiting impressions. None: the store's first url (store.urls), so the "
        "waiting state shares the embedding store's memory and its maxmemory-policy: an evicting policy "
        "may drop waiting impressions (their labels are lost) and the state competes with the rows for "
        "memory. kelp join warns at start; set a standalone Redis for production.",
    )
    state_ttl_margin_s: float = Field(
        3600.0,
        ge=0,
        allow_inf_nan=False,
        description="Waiting state expires in Redis this long after it should have been deleted: a "
        "bound on state a lost deadline would otherwise keep forever.",
    )
    dead_letter_topic: str | None = Field(
        "kelp-join-dead-letter",
        description="Inputs that cannot be read, and impressions whose labelled event the output topic "
        "refuses for good (too large), go here with the reason in headers. None: counted only, and such an "
        "event is dropped (logged as an error).",
    )
    max_poll_records: int = Field(2000, ge=1, description="Input records handled per step.")
    host: str = "0.0.0.0"
    port: int = Field(9410, ge=1, le=65_535, description="/metrics, /healthz and /readyz of the joiner.")

    @field_validator("impressions_topic", "output_topic", "dead_letter_topic")
    @classmethod
    def _topics(cls, value: str | None) -> str | None:
        return None if value is None else kafka_topic(value)

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        return None if value is None else url_with_plain_userinfo(value, "url")

    @model_validator(mode="after")
    def _distinct_topics(self) -> Self:
        seen = {self.impressions_topic: "impressions_topic"}
        for i, action in enumerate(self.actions):
            if action.topic in seen:
                raise ValueError(
                    f"actions[{i}].topic: {action.topic!r} is already {seen[action.topic]}; "
                    "each input topic is read once"
                )
            seen[action.topic] = f"actions[{i}].topic"
        if self.output_topic is not None and self.output_topic in seen:
            also = seen[self.output_topic]
            raise ValueError(f"output_topic: {self.output_topic!r} is also an input ({also})")
        return self

    @property
    def longest_window_s(self) -> float:
        return max((a.window_s for a in self.actions), default=0.0)

    def windows(self) -> dict[str, float]:
        """Each task's window: the longest of its action topics' windows."""
        out: dict[str, float] = {}
        for action in self.actions:
            out[action.task] = max(out.get(action.task, 0.0), action.window_s)
        return out
