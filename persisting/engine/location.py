"""Where a topic lives: a local folder, or an object-store URI with a local folder beside it.

``storage_path`` is either a local folder (as before) or a URI Lance stores to: ``s3://bucket/prefix``,
``gs://bucket/prefix``, ``az://container/prefix``; ``file:///absolute/path`` is a local folder. Anything else
that looks like a URI (``scheme:...``) is refused, so ``s3:/bucket`` or ``http://...`` never becomes a local
folder named ``s3:`` or ``http:``.

With an object-store URI, what must fsync fast stays on local disk, under ``local_path`` (one folder per URI):
the write-ahead log, the topic's lock, its consumption log. What is flushed (the bucket datasets) and what a
fresh node needs to read it (the topic's settings and schema, and who owns the topic) lives in the object
store; see ``persisting/engine/object_store.py``.

``storage_options`` are Lance's object-store options (``endpoint``, ``region``, ``aws_access_key_id``,
``allow_http``, ...), from the argument, else the JSON object in ``PERSISTING_STORAGE_OPTIONS``; Lance also reads
the usual ``AWS_*``/``GOOGLE_*``/``AZURE_*`` variables itself. They are never logged or shown in a repr.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..errors import ConfigError

OBJECT_STORE_SCHEMES = ("s3", "gs", "az")
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
_FORMS = "a local folder, file:///absolute/path, s3://bucket/prefix, gs://bucket/prefix or az://container/prefix"


@dataclass(frozen=True)
class Location:
    """``uri``: the object-store root (no trailing slash), None for local storage; ``local``: the local root (the
    whole topic for local storage; its log, lock and consumption log otherwise)."""

    uri: str | None
    local: Path
    options: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def remote(self) -> bool:
        return self.uri is not None

    def describe(self) -> str:
        """For messages and logs: never the options (credentials)."""
        return self.uri if self.uri is not None else str(self.local)

    def topic_uri(self, dirname: str) -> str:
        if self.uri is None:
            return str(self.local / dirname)
        return f"{self.uri}/{dirname}"


def default_local_root(uri: str) -> Path:
    """The local folder of an object-store URI: under ``$XDG_STATE_HOME/persisting`` (``~/.local/state``), one
    folder per URI (readable name plus a hash: injective and short)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    readable = re.sub(r"[^A-Za-z0-9_-]+", "-", uri)[:80]
    return Path(state) / "persisting" / f"{readable}-{hashlib.sha256(uri.encode()).hexdigest()[:12]}"


def storage_options_from(options: Mapping[str, Any] | None) -> dict[str, str]:
    """Explicit options, else ``PERSISTING_STORAGE_OPTIONS`` (a JSON object); values as Lance wants them (str)."""
    if options is None:
        raw = os.environ.get("PERSISTING_STORAGE_OPTIONS")
        if not raw:
            return {}
        try:
            options = json.loads(raw)
        except ValueError as exc:
            raise ConfigError(f"PERSISTING_STORAGE_OPTIONS is not valid JSON ({exc.__class__.__name__})") from None
        if not isinstance(options, dict):
            raise ConfigError('PERSISTING_STORAGE_OPTIONS must be a JSON object such as {"region": "us-east-1"}')
    if not isinstance(options, Mapping):
        raise ConfigError(f"storage_options must be a mapping of str to str, got {type(options).__qualname__}")
    out: dict[str, str] = {}
    for key, value in options.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"storage_options keys must be non-empty str, got {key!r}")
        if isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif isinstance(value, str | int | float):
            out[key] = str(value)
        else:  # the value is not shown: it may be a credential
            raise ConfigError(f"storage_options[{key!r}] must be a str, bool or number, got {type(value).__qualname__}")
    return out


def parse_location(
    storage_path: str | os.PathLike[str],
    storage_options: Mapping[str, Any] | None = None,
    local_path: str | os.PathLike[str] | None = None,
) -> Location:
    """Check ``storage_path`` and make its Location; a bad or unsupported one is a ``ConfigError`` saying why."""
    text = os.fspath(storage_path)
    if not isinstance(text, str) or not text:
        raise ConfigError(f"storage_path must be a non-empty path or URI, got {storage_path!r}")
    match = _URI.match(text) if not isinstance(storage_path, Path) else None
    if match is None:
        return _local(Path(text), storage_options, local_path)
    scheme = match.group(1).lower()
    if scheme == "file":
        if not text.startswith("file:///"):
            raise ConfigError(
                f"storage_path {text!r}: a file URI names an absolute local path, as in file:///data/topics"
            )
        return _local(Path(text[len("file://") :]), storage_options, local_path)
    if scheme not in OBJECT_STORE_SCHEMES:
        raise ConfigError(
            f"storage_path {text!r} has the scheme {scheme!r}, which persisting does not store to; use {_FORMS} "
            "(a local folder whose name holds ':' can be given as ./name)"
        )
    rest = text[len(match.group(0)) :]
    if not rest.startswith("//"):
        raise ConfigError(f"storage_path {text!r} is not a URI Lance opens; write it as {scheme}://bucket/prefix")
    bucket, _, prefix = rest[2:].partition("/")
    if not bucket or any(c in text for c in "?#") or "//" in prefix:
        raise ConfigError(
            f"storage_path {text!r} must name a bucket and an optional prefix, as in {scheme}://bucket/topics "
            "(no query, fragment or empty path segment); endpoint and credentials go in storage_options"
        )
    uri = f"{scheme}://{bucket}" + (f"/{prefix.rstrip('/')}" if prefix.strip("/") else "")
    local = Path(local_path or os.environ.get("PERSISTING_LOCAL_PATH") or default_local_root(uri)).absolute()
    return Location(uri, local, storage_options_from(storage_options))


def _local(path: Path, storage_options: Mapping[str, Any] | None, local_path: Any) -> Location:
    if storage_options:
        raise ConfigError("storage_options apply to an object-store storage_path (s3://, gs://, az://) only")
    if local_path is not None:
        raise ConfigError("local_path applies to an object-store storage_path only: a local one holds everything")
    return Location(None, path.absolute())


class ObjectStoreTopic(Protocol):
    """What the engine's Topic calls on the object-store side of a topic (``object_store.TopicStore``)."""

    def backend(self, factory: Callable[..., Any]) -> Callable[..., Any]: ...

    def attach(self, path: Path, settings: Mapping[str, Any]) -> None: ...

    def publish_kinds(self, kinds: Mapping[str, str]) -> None: ...

    def detach(self) -> None: ...


def object_store_topic(location: Location, name: str, dirname: str) -> ObjectStoreTopic | None:
    """The object-store side of topic ``name`` (its folder ``dirname``), or None for local storage."""
    if location.uri is None:
        return None
    from .object_store import TopicStore  # imports Lance: only for object-store locations

    return TopicStore(location, name, dirname)
