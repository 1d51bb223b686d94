"""A topic's schema: the kind of each field (see wire/codec.py), fixed by the first put that wrote it.

New kinds travel in the log frame of the put that introduced them until a flush writes ``schema.json`` (before any
frame leaves the log), so a replay always knows how to decode what it reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ..errors import SchemaConflictError
from .layout import write_json_atomic


class Schema:
    def __init__(self, kinds: Mapping[str, str] | None = None) -> None:
        self.kinds: dict[str, str] = dict(kinds or {})
        self._written = dict(self.kinds)  # what schema.json holds

    def load(self, stored: Mapping[str, str]) -> None:
        """At open: what ``schema.json`` holds."""
        self.kinds = dict(stored)
        self._written = dict(stored)

    def new_kinds(self, given: Mapping[str, str]) -> dict[str, str]:
        """The fields of ``given`` this schema does not have yet; a field stored with another kind raises
        ``SchemaConflictError``."""
        new: dict[str, str] = {}
        for field_name, kind in given.items():
            stored = self.kinds.get(field_name)
            if stored is None:
                new[field_name] = kind
            elif stored != kind:
                raise SchemaConflictError(field_name, stored, kind)
        return new

    def add(self, kinds: Mapping[str, str]) -> None:
        self.kinds.update(kinds)

    def save(self, path: Path) -> None:
        """Write ``schema.json`` if it changed (blocking)."""
        if self.kinds != self._written:
            write_json_atomic(path, self.kinds)
            self._written = dict(self.kinds)
