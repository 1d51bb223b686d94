"""``persisting-broker check``: a store verified offline, and repaired where no acknowledged row is lost.

Per topic, read without writing anything (the engine's own parsers, none of its recovering opens):

    topic.json, schema.json, state.json   settings.py       format, name, buckets; kinds; flushed_upto
    consumption.log                       consumption_log   checksummed records, a cut or damaged one
    wal/<first index>.log                 log_frames        frames and checksums, overlaps, what a replay needs
    bucket-<i>.lance                      buckets           manifests, interrupted rewrites, orphan files, order
    columns of every bucket               columns           a kind for each, Arrow types and layouts
    rows across all of them               rows              gaps, doubles, clears and takes, keys, patches
    spool/, temporary and other files     files             needed spool files, leftovers

A check holds the topic's lock (locks.py: the engine's flock, taken without waiting), so it refuses a topic a
process has open. ``check_topic(folder, repair=True)`` runs each finding's repair, then checks again
(report.py: what was done, what is left). ``topic_folders`` lists the topics of a storage folder.
"""

from __future__ import annotations

from pathlib import Path

from .locks import hold
from .report import Finding, TopicReport
from .topic import check_topic

__all__ = ["Finding", "TopicReport", "check_topic", "hold", "topic_folders"]


def topic_folders(storage: Path) -> list[Path]:
    """The folders of ``storage`` that hold a topic (a ``topic.json``, or data without one)."""
    found = []
    for path in sorted(p for p in storage.iterdir() if p.is_dir()):
        if (path / "topic.json").exists() or (path / "wal").is_dir() or any(path.glob("bucket-*.lance")):
            found.append(path)
    return found
