"""The docs name only config keys that exist, and the README carries no tracker history.

A reader copies a key from the docs into a config file; a key that was renamed
or never existed then fails at start-up (every section forbids unknown keys),
far from the sentence that taught it. So every key the docs name in a
recognisable form must resolve to a field of :class:`~kelp.config.KelpConfig`:

* a backticked dotted path that starts with a top-level section, as in
  `` `store.layout.kind` `` or `` `features.sparse[0].max_ids` `` (README.md,
  docs/*.md, example READMEs);
* the same path under the chart's ``config`` value, `` `config.store.urls` ``
  (also in helm/README.md, whose bare dotted paths are chart values);
* an environment override, ``KELP_SOURCE__SECURITY__SASL_PASSWORD``.

The walk follows the pydantic tree itself (optionals, discriminated unions,
lists, dicts, aliases), so the test needs no list of keys to keep in step.
"""

from __future__ import annotations

import re
import types
from collections.abc import Iterator
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel

from kelp.config import KelpConfig

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = tuple(KelpConfig.model_fields)

# Where a bare dotted path means a config key. helm/README.md is left out: there
# `trainer.replicas` and the like are chart values, and only `config.`-prefixed
# paths are config keys (see CHART_DOCS).
KEY_DOCS = (
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted(ROOT.glob("examples/*/README.md")),
)
CHART_DOCS = (ROOT / "helm" / "README.md",)

# Chart values (helm/kelp/values.yaml) that docs outside the chart name, spelled
# like config keys because the chart's sections share the names `trainer`,
# `serving` and `join`. Each entry must still be a value of the chart (checked below).
CHART_VALUES_IN_DOCS = frozenset(
    {
        "trainer.image",
        "serving.image",
        "join.enabled",
        "join.terminationGracePeriodSeconds",
        "serving.autoscaling",
        "trainer.checkpoints.persistence",
    }
)

# Layout 1's top-level `kafka:` section: the loader refuses it with a hint, so a key
# under it in the docs is stale by definition. Matched to be reported, never resolved.
RETIRED_SECTIONS = ("kafka",)

# A path segment: `.name` (letters, digits, `_`, and `*` as a wildcard) or `[index]`.
# A segment that is a file suffix ends the path without being part of it, so
# `store.py` and `metrics.py` (modules, not keys) never match; a path followed by
# `(` is a call (`store.flush(force)`), not a key, and is skipped.
_SUFFIXES = r"(?:py|md|yaml|yml|json|toml|txt|png|tsv|csv|gz)\b"
_SEGMENTS = rf"(?:\.(?!{_SUFFIXES})[A-Za-z_*][\w*]*|\[[^\]`]*\])+"
_END = r"(?![\w(.])"


def _key_pattern(sections: tuple[str, ...], prefix: str = "") -> re.Pattern[str]:
    return re.compile(rf"`{prefix}(?P<key>(?:{'|'.join(sections)}){_SEGMENTS}){_END}")


BARE_KEY = _key_pattern(SECTIONS + RETIRED_SECTIONS)
RETIRED_KEY = _key_pattern(RETIRED_SECTIONS)
CHART_KEY = _key_pattern(SECTIONS + RETIRED_SECTIONS, prefix=r"config\.")
ENV_KEY = re.compile(
    rf"\bKELP_(?P<key>(?:{'|'.join(SECTIONS + RETIRED_SECTIONS).upper()})(?:__[A-Z0-9*]+(?:_[A-Z0-9*]+)*)+)"
)
_TOKEN = re.compile(r"\.([^.\[]+)|\[([^\]]*)\]")


def _members(annotation: Any) -> list[Any]:
    """The concrete types a field may hold: Annotated, Optional and unions unwrapped."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _members(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [member for arg in get_args(annotation) for member in _members(arg)]
    return [annotation]


def _field_names(model: type[BaseModel]) -> dict[str, Any]:
    """What a config file may write for each field: its alias, and its name where the model allows it."""
    by_name = model.model_config.get("validate_by_name") or model.model_config.get("populate_by_name")
    names: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if field.alias is None or by_name:
            names[name] = field.annotation
        if field.alias is not None:
            names[field.alias] = field.annotation
    return names


def _resolves(annotation: Any, parts: list[tuple[str, bool]]) -> bool:
    """True if the path ``parts`` (segment, is-an-index) leads somewhere in a value of ``annotation``."""
    if not parts:
        return True
    return any(_resolves_in(member, parts) for member in _members(annotation))


def _resolves_in(kind: Any, parts: list[tuple[str, bool]]) -> bool:
    segment, is_index = parts[0]
    if kind is Any:
        return True  # free-form (`trainer.model_args`, `source.decoder_args`): any key below it
    origin = get_origin(kind)
    if origin in (list, tuple, set, frozenset):
        (item, *_) = get_args(kind) or (Any,)
        # `features.sparse[0].pooling` and `features.sparse.pooling` both name the item's field.
        return _resolves(item, parts[1:] if is_index or segment.isdigit() else parts)
    if origin is dict:
        _, value = get_args(kind) or (str, Any)
        return _resolves(value, parts[1:])  # `store.layout.table_buckets.<table>`
    if isinstance(kind, type) and issubclass(kind, BaseModel) and not is_index:
        fields = _field_names(kind)
        return any(_resolves(fields[name], parts[1:]) for name in fields if fnmatchcase(name, segment))
    return False  # a leaf (str, int, Literal...) has nothing below it


def _parts(path: str) -> list[tuple[str, bool]]:
    return [(name or index, not name) for name, index in _TOKEN.findall(path)]


def resolves(key: str) -> bool:
    """Whether dotted ``key`` (``store.layout.kind``, ``features.sparse[0].max_ids``) is a config field."""
    section = re.match(r"\w+", key)
    assert section is not None, key
    field = KelpConfig.model_fields.get(section[0])
    return field is not None and _resolves(field.annotation, _parts(key[section.end() :]))


def _env_path(name: str) -> str:
    """``SOURCE__SECURITY__SASL_PASSWORD`` -> ``source.security.sasl_password``."""
    section, *levels = name.lower().split("__")
    return section + "".join(f"[{level}]" if level.isdigit() else f".{level}" for level in levels)


def _keys(docs: tuple[Path, ...], patterns: tuple[re.Pattern[str], ...]) -> Iterator[tuple[str, str]]:
    for doc in docs:
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for pattern in patterns:
                for match in pattern.finditer(line):
                    key = match["key"]
                    yield f"{doc.relative_to(ROOT)}:{number}", _env_path(key) if pattern is ENV_KEY else key


def documented_keys() -> list[tuple[str, str]]:
    """(file:line, dotted key) for every config key the docs name."""
    return [
        *_keys(KEY_DOCS, (BARE_KEY, CHART_KEY, ENV_KEY)),
        *_keys(CHART_DOCS, (RETIRED_KEY, CHART_KEY, ENV_KEY)),
    ]


def test_the_walk_tells_real_keys_from_stale_ones() -> None:
    """The resolver itself: fields, indexes, aliases, unions, dicts, free-form args, wildcards."""
    for real in (
        "store.layout.kind",
        "features.sparse[0].max_ids",
        "features.sparse[].pooling",
        "features.tables.admission.min_count",
        "source.bootstrap_servers",  # kafka only
        "source.csv.label_columns",  # file only
        "source.json.label_field",  # the alias of json_mapping
        "source.security.ssl_*file",
        "store.layout.table_buckets.user",
        "trainer.model_args.hidden",
        "metrics.host",
        "serving.host",
    ):
        assert resolves(real), real
    for stale in (
        "kafka.max_message_bytes",
        "source.max_message_size",
        "source.dead_letter",
        "store.layout.kind.extra",
        "serving.hostname",
        "features.sparse[0].nope",
        "source.security.tls_*",
    ):
        assert not resolves(stale), stale


def test_the_patterns_find_keys_and_skip_modules_calls_and_chart_values() -> None:
    line = (
        "set `store.layout.kind: keys`, `features.sparse[1]`, `metrics.port + 1`; not `store.py`, "
        "`store.flush(force)`, `kelp.store.check_store_config` or `KELP_BROKER`; env KELP_STORE__TLS__CA_FILE"
    )
    assert [m["key"] for m in BARE_KEY.finditer(line)] == [
        "store.layout.kind",
        "features.sparse[1]",
        "metrics.port",
    ]
    assert [_env_path(m["key"]) for m in ENV_KEY.finditer(line)] == ["store.tls.ca_file"]
    assert [
        m["key"] for m in CHART_KEY.finditer("`config.source.security.ssl_cafile`, `trainer.replicas`")
    ] == ["source.security.ssl_cafile"]


def test_every_config_key_named_in_the_docs_is_a_field() -> None:
    found = documented_keys()
    assert len(found) > 100, "the patterns no longer find the docs' keys"
    stale = [
        f"{where}: {key}" for where, key in found if key not in CHART_VALUES_IN_DOCS and not resolves(key)
    ]
    assert not stale, "keys that are not fields of KelpConfig:\n" + "\n".join(stale)


def test_the_chart_values_the_docs_name_are_values_of_the_chart() -> None:
    values = yaml.safe_load((ROOT / "helm" / "kelp" / "values.yaml").read_text(encoding="utf-8"))
    for key in CHART_VALUES_IN_DOCS:
        node = values
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"{key} is not a chart value"
            node = node[part]
        assert not resolves(key), f"{key} is a config field now: drop it from CHART_VALUES_IN_DOCS"


# A tracker number after "issue(s)" or "stop(s)", or "#<n>": which piece of work did what is history.
HISTORY = re.compile(r"(?i)\b(?:issue|stop)s?\b\W{0,3}#?\d+|(?<![\w/&])#\d+\b")


def test_the_history_pattern_finds_tracker_numbers_only() -> None:
    issue, stop = "Issue " + "28", "stop " + "24"  # built, so this file cites no number itself
    text = f"{issue} added it; {stop}'s table; see #12; the issue's words; [a](#b-2); 3 stops"
    found = HISTORY.findall(text)
    assert found == [issue, stop, "#12"]


def test_the_readme_names_no_issue_or_stop_numbers() -> None:
    """History (which issue or stop did what) lives in CHANGELOG.md; the README says what is."""
    found = HISTORY.findall((ROOT / "README.md").read_text(encoding="utf-8"))
    assert not found, found
