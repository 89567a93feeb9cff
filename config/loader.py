"""Load a :class:`KelpConfig` from YAML plus ``KELP_...`` environment overrides.

Environment overrides use ``__`` between levels, the way Kubernetes users
expect from twelve-factor apps::

    KELP_STORE__BACKEND=redis
    KELP_STORE__URLS=redis://10.0.0.1:6379,redis://10.0.0.2:6379
    KELP_STORE__PASSWORD=...            # secrets belong in env, not in the file
    KELP_FEATURES__SPARSE__0__MAX_IDS=8 # list items by index
    KELP_DEPLOYMENT=prod                # top-level fields need no "__"

A value that starts with ``[`` or ``{`` is parsed as YAML; anything else stays
a string and pydantic converts it to the field's type. Secret fields
(:mod:`kelp.config.secrets`) always take the value verbatim. Variables without
``__`` that are not top-level fields (``KELP_CONFIG``...) are not overrides.

The file is read within the bounds of :mod:`kelp.config.yaml_reader` (size,
aliases, nesting, no duplicate keys). Every failure becomes one
:class:`~kelp.errors.ConfigError` whose lines name the field, the value that
was given (and where it came from), and what was expected; the value of a
secret field is never shown, and passwords in URLs are redacted.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from kelp.config.root import CONFIG_VERSION, KelpConfig
from kelp.config.secrets import is_secret_field
from kelp.config.sources import FileSourceConfig
from kelp.config.yaml_reader import InvalidYamlError, parse_yaml_text, read_config_file
from kelp.errors import ConfigError
from kelp.redaction import REDACTED, redact_text, redact_url

__all__ = [
    "DEPRECATED_KEYS",
    "ENV_PREFIX",
    "apply_deprecated_keys",
    "apply_env_overrides",
    "format_validation_error",
    "load_config",
    "parse_config",
]

ENV_PREFIX = "KELP_"
log = logging.getLogger("kelp.config")

DEPRECATED_KEYS: dict[str, str] = {}
"""Renamed settings: old dotted key -> new dotted key (sections only, no list indexes).

A config that still uses an old key (in the file or as ``KELP_...``) loads: the
value moves to the new key and one hint line on stderr names both. When a field
is renamed, add its entry here and a CHANGELOG line; drop the entry one minor
release later, after which the old key is an "unknown field" like any typo.
Empty today: no key has been renamed since layout 2 (layout-1 keys are refused
with a hint instead, see :func:`_moved_fields`).
"""


def _read_yaml(path: Path) -> dict[str, Any] | None:
    """The file's top-level mapping; None when it holds nothing (only whitespace or comments)."""
    data = read_config_file(path)
    if data is None:
        return None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _env_value(name: str, raw: str, path: list[str]) -> Any:
    """The value of ``KELP_...`` variable ``name`` for field ``path``.

    Secret fields take it verbatim: a password is a string whatever its first
    character, and is never parsed (a parse error would quote it).
    """
    if is_secret_field(KelpConfig, path):
        return raw
    stripped = raw.strip()
    if stripped.startswith(("[", "{")):
        try:
            return parse_yaml_text(stripped, f"env {name}")
        except InvalidYamlError:
            return raw
    return raw


def apply_env_overrides(
    data: dict[str, Any], environ: Mapping[str, str]
) -> tuple[dict[str, Any], dict[tuple[str | int, ...], str]]:
    """Return a copy of ``data`` with ``KELP_...`` variables applied, and where each came from.

    The second value maps a field location to the variable that set it, so
    errors can say "from env KELP_STORE__BACKEND".
    """
    result: dict[str, Any] = _deep_copy(data)
    sources: dict[tuple[str | int, ...], str] = {}
    top_level = set(KelpConfig.model_fields) | {"kafka"}  # kafka: layout 1, answered with a hint
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX) :]
        if "__" not in rest and rest.lower() not in top_level:
            continue
        path = [p.lower() for p in rest.split("__")]
        if any(not p for p in path):
            raise ConfigError(f"env {name}: empty path segment (use single '__' between levels)")
        loc = _set_path(result, path, _env_value(name, environ[name], path), name)
        sources[loc] = name
    return result, sources


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


def _set_path(root: dict[str, Any], path: list[str], value: Any, var: str) -> tuple[str | int, ...]:
    node: Any = root
    loc: list[str | int] = []
    for i, segment in enumerate(path):
        last = i == len(path) - 1
        key: str | int = segment
        if isinstance(node, list):
            if not segment.isdigit() or int(segment) >= len(node):
                raise ConfigError(
                    f"env {var}: '{segment}' is not an index of the {len(node)}-item list at "
                    f"{'.'.join(map(str, loc)) or 'top level'}"
                )
            key = int(segment)
        elif not isinstance(node, dict):
            raise ConfigError(f"env {var}: {'.'.join(map(str, loc))} is a value, not a section")
        loc.append(key)
        if last:
            node[key] = value
        else:
            if isinstance(node, dict) and (key not in node or node[key] is None):
                node[key] = {}
            node = node[key]
    return tuple(loc)


def _allowed_fields(loc: tuple[int | str, ...]) -> list[str] | None:
    """Field names of the model that owns ``loc``'s parent, for 'unknown field' hints.

    ``loc`` is pydantic's raw location: inside a discriminated union (``source``,
    dense ``transforms``) the part after the field is the member's tag.
    """
    model: type[BaseModel] | None = KelpConfig
    members: list[type[BaseModel]] = []
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if members:  # the previous field was a union: this part is the tag picking the member
            model = next((m for m in members if _tag_of(m) == part), None)
            members = []
            continue
        if model is None:
            return None
        field = model.model_fields.get(part)
        if field is None:
            return None
        found = _models_in(field.annotation)
        model, members = (found[0], []) if len(found) == 1 else (None, found)
    if model is None:
        return None
    return sorted(name for name in model.model_fields if name != "kind" or _tag_of(model) is None)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The config models an annotation can hold (several for a union)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in getattr(annotation, "__args__", ()) or ():
        found += [m for m in _models_in(arg) if m not in found]
    return found


def _tag_of(model: type[BaseModel]) -> str | None:
    """The ``kind`` literal of a discriminated-union member, else None."""
    field = model.model_fields.get("kind")
    args = getattr(field.annotation, "__args__", ()) if field is not None else ()
    return args[0] if len(args) == 1 and isinstance(args[0], str) else None


_SOURCE_TAGS = ("kafka", "file")
_TRANSFORM_TAGS = ("log1p", "clip", "standardize")
_FIELD_PREFIX = re.compile(r"^([a-z_]+(?:\.[a-z_]+|\[\d+\])+): (.+)$", re.S)


def _without_tags(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """``loc`` minus the union tags pydantic inserts (``source.kafka.topics`` -> ``source.topics``)."""
    out: list[int | str] = []
    for i, part in enumerate(loc):
        source_tag = i == 1 and loc[0] == "source" and part in _SOURCE_TAGS
        transform_tag = i >= 2 and loc[i - 2] == "transforms" and part in _TRANSFORM_TAGS
        if not (source_tag or transform_tag):
            out.append(part)
    return tuple(out)


def _dotted(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def format_validation_error(
    exc: ValidationError, origin: str, sources: Mapping[tuple[str | int, ...], str] | None = None
) -> str:
    """One line per problem: ``origin: field: got VALUE (from env X): expected ...``."""
    lines = []
    for err in exc.errors(include_url=False):
        raw_loc = tuple(err["loc"])
        loc = _without_tags(raw_loc)
        field = _dotted(loc)
        given = err.get("input")
        origin_note = _env_note(loc, sources or {})
        if err["type"] in ("union_tag_not_found", "union_tag_invalid"):
            tags = _SOURCE_TAGS if loc[-1:] == ("source",) else _TRANSFORM_TAGS
            expected = err.get("ctx", {}).get("expected_tags") or ", ".join(f"'{t}'" for t in tags)
            shown = (
                "required field is missing"
                if err["type"] == "union_tag_not_found"
                else (f"got {err['ctx']['tag']!r}{_env_note((*loc, 'kind'), sources or {})}")
            )
            lines.append(f"{origin}: {field}.kind: {shown}: expected one of {expected}")
            continue
        if err["type"] == "extra_forbidden":
            allowed = _allowed_fields(raw_loc)
            hint = f"; expected one of: {', '.join(allowed)}" if allowed else ""
            lines.append(f"{origin}: {field}: unknown field{origin_note}{hint}")
            continue
        if err["type"] == "missing":
            lines.append(f"{origin}: {field}: required field is missing")
            continue
        msg = err["msg"]
        msg = msg.removeprefix("Value error, ")
        prefixed = _FIELD_PREFIX.match(msg) if not loc else None
        if prefixed:  # a cross-section rule names its own field
            lines.append(f"{origin}: {prefixed.group(1)}: {prefixed.group(2)}")
            continue
        shown = "" if isinstance(given, dict) else f"got {_shown(loc, given)}{origin_note}: "
        lines.append(f"{origin}: {field}: {shown}{_expected(msg)}")
    return "\n".join(redact_text(line) for line in lines)


def _shown(loc: tuple[int | str, ...], given: Any) -> str:
    """``given`` as an error shows it: never a secret field's value, never a URL's password."""
    if is_secret_field(KelpConfig, loc):
        return REDACTED
    return repr(_without_passwords(given))


def _without_passwords(value: Any) -> Any:
    if isinstance(value, str):
        return redact_url(value) if "://" in value or "@" in value else value
    if isinstance(value, list | tuple):
        return [_without_passwords(v) for v in value]
    return value


def _env_note(loc: tuple[int | str, ...], sources: Mapping[tuple[str | int, ...], str]) -> str:
    """Name the env variable that set ``loc`` (or a field below it), if any."""
    names = sorted(var for where, var in sources.items() if where[: len(loc)] == loc)
    return f" (from env {', '.join(names)})" if names else ""


def _expected(msg: str) -> str:
    if msg.startswith("Input should be "):
        return "expected " + msg.removeprefix("Input should be ")
    return msg


def _moved_fields(data: Mapping[str, Any], origin: str) -> list[str]:
    """One line per setting an older config layout kept elsewhere, saying where it lives now.

    Layout 1 had the Kafka settings at the top level (``kafka:``) and the file
    settings one level down (``source: {kind: file, file: {...}}``); layout 2
    makes ``source`` one discriminated union. Old files fail with these hints
    rather than a list of unknown fields.
    """
    lines = []
    if data.get("version") == 1:
        lines.append(
            f"{origin}: version: got 1: this is a layout-1 config; layout {CONFIG_VERSION} moved kafka: and "
            f"source.file: into source: (kind: kafka | file), then set version: {CONFIG_VERSION}"
        )
    if "kafka" in data:
        lines.append(
            f"{origin}: kafka: moved into source: write source: {{kind: kafka, bootstrap_servers: [...], "
            "topics: [...], ...}} (and env KELP_KAFKA__X is now KELP_SOURCE__X)"
        )
    source = data.get("source")
    if isinstance(source, Mapping) and isinstance(source.get("file"), Mapping):
        lines.append(
            f"{origin}: source.file: moved up one level: write source: {{kind: file, path: ..., "
            "format: ...}} (path, format, csv and limit sit directly under source)"
        )
    return lines


def apply_deprecated_keys(
    data: dict[str, Any], origin: str, table: Mapping[str, str] | None = None
) -> list[str]:
    """Move every deprecated key of ``data`` (in place) to its new name; one hint line per key moved.

    ``table`` defaults to :data:`DEPRECATED_KEYS`. When both the old and the new
    key are set, the new one wins and the hint says the old one was ignored.
    """
    hints = []
    for old, new in (DEPRECATED_KEYS if table is None else table).items():
        *old_parents, old_key = old.split(".")
        holder = _section(data, old_parents, create=False)
        if holder is None or old_key not in holder:
            continue
        value = holder.pop(old_key)
        *new_parents, new_key = new.split(".")
        target = _section(data, new_parents, create=True)
        if target is None:
            hints.append(f"{origin}: {old} is deprecated: use {new} (not applied: a parent of it is a value)")
        elif new_key in target:
            hints.append(f"{origin}: {old} is deprecated and was ignored: {new} is set too; remove {old}")
        else:
            target[new_key] = value
            hints.append(f"{origin}: {old} is deprecated: rename it to {new} (its value was applied there)")
    return hints


def _section(data: dict[str, Any], path: list[str], *, create: bool) -> dict[str, Any] | None:
    """The mapping at ``path`` inside ``data`` (made when ``create``); None when it is absent or a value."""
    node: Any = data
    for part in path:
        if not isinstance(node, dict):
            return None
        if node.get(part) is None and create:
            node[part] = {}
        node = node.get(part)
    return node if isinstance(node, dict) else None


def parse_config(
    data: Mapping[str, Any], origin: str = "<config>", environ: Mapping[str, str] | None = None
) -> KelpConfig:
    """Validate a mapping (already read from YAML) with optional env overrides.

    Deprecated keys (:data:`DEPRECATED_KEYS`) are renamed first, each with a
    one-line warning (stderr, through logging).
    """
    merged, sources = apply_env_overrides(dict(data), environ if environ is not None else {})
    for hint in apply_deprecated_keys(merged, origin):
        log.warning("%s", hint)
    moved = _moved_fields(merged, origin)
    if moved:
        raise ConfigError("\n".join(moved))
    try:
        return KelpConfig.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, origin, sources)) from None


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> KelpConfig:
    """Read, override from the environment (``os.environ`` by default) and validate a config file.

    Relative paths inside the file (data files, checkpoint dirs) are resolved
    against the file's directory, so a config works from any working directory.
    """
    path = Path(path)
    environ = os.environ if environ is None else environ
    data = _read_yaml(path)
    if data is None:
        if not any(name.startswith(f"{ENV_PREFIX}SOURCE__") for name in environ):
            # Say so, rather than "source: required field is missing" about a file that has no fields.
            raise ConfigError(
                f"{path}: the config file is empty (nothing but whitespace or comments); a config needs at "
                "least a source: section, see examples/criteo-kaggle.yaml"
            )
        data = {}  # everything comes from KELP_... variables
    cfg = parse_config(data, str(path), environ)
    return _resolve_paths(cfg, path.parent.resolve())


def _resolve_paths(cfg: KelpConfig, base: Path) -> KelpConfig:
    if isinstance(cfg.source, FileSourceConfig):
        if not cfg.source.path.is_absolute():
            cfg.source.path = base / cfg.source.path
        for join in cfg.source.csv.joins if cfg.source.csv is not None else ():
            if not join.path.is_absolute():
                join.path = base / join.path
    if not cfg.trainer.checkpoint_dir.is_absolute():
        cfg.trainer.checkpoint_dir = base / cfg.trainer.checkpoint_dir
    if cfg.publisher.path is not None and not cfg.publisher.path.is_absolute():
        cfg.publisher.path = base / cfg.publisher.path
    return cfg
