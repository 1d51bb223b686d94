"""A topic's settings files: ``topic.json`` (format, name, buckets, backend), ``schema.json`` (field -> kind) and
``state.json`` (``flushed_upto``). Without a readable ``topic.json`` of this format nothing else can be read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..engine.layout import topic_dirname
from ..engine.opening import FORMAT_VERSION
from .facts import Facts
from .report import TopicReport

LANCE_BACKENDS = ("LanceBackend", "PersistingBackend")  # backends whose buckets are Lance datasets


def _read(report: TopicReport, path: Path) -> tuple[bool, Any]:
    """(readable, value): the JSON of ``path``, None when it does not exist."""
    try:
        return True, json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return True, None
    except (OSError, ValueError) as exc:
        report.problem(path.name, f"is not readable JSON ({exc})")
        return False, None


def check_settings(facts: Facts, report: TopicReport) -> bool:
    """Read the settings into ``facts``; False where the rest of the topic cannot be checked."""
    readable, meta = _read(report, facts.folder / "topic.json")
    if not readable:
        return False
    if meta is None:
        report.problem("topic.json", "missing: the topic's settings are unknown, so nothing else was read")
        return False
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        report.problem(
            "topic.json",
            f"format {got!r}, this persisting reads format {FORMAT_VERSION}: written by another version (or not by "
            "persisting); nothing else was read",
        )
        return False
    name, buckets = meta.get("name"), meta.get("num_buckets")
    if isinstance(name, str):
        facts.name = report.name = name
        if topic_dirname(name) != facts.folder.name:
            report.problem("topic.json", f"names topic {name!r}, whose folder would be {topic_dirname(name)!r}")
    else:
        report.problem("topic.json", f"has no topic name (name={name!r})")
    if type(buckets) is not int or buckets < 1 or not isinstance(meta.get("bucket_column"), str):
        report.problem("topic.json", f"num_buckets={buckets!r}, bucket_column={meta.get('bucket_column')!r}: not "
                       "settings this engine writes; nothing else was read")  # fmt: skip
        return False
    facts.num_buckets = buckets
    backend = meta.get("backend")
    facts.lance = backend in LANCE_BACKENDS
    if not facts.lance:
        report.note("topic.json", f"backend {backend!r}: its buckets are not Lance datasets and were not read")
    readable, kinds = _read(report, facts.folder / "schema.json")
    if kinds is not None and not (
        isinstance(kinds, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in kinds.items())
    ):
        report.problem("schema.json", "is not a map of field names to kinds")
    elif kinds is not None:
        facts.kinds = kinds
    readable, state = _read(report, facts.folder / "state.json")
    flushed = state.get("flushed_upto") if isinstance(state, dict) else None
    if state is not None and (type(flushed) is not int or flushed < 0):
        report.problem("state.json", f"flushed_upto={flushed!r} is not an index")
    elif isinstance(flushed, int):
        facts.flushed_upto = flushed
    return True
