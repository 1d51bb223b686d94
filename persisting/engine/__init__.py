"""The engine: where the semantics live. ``Queue`` (embedded) and the broker drive it through what this module
exports, and nothing else of the package.

The interface::

    Topic(name, storage_path, config, backend, *, arena_resolver=None, on_flushed=None, remote=None)
        lifecycle   await open(); await close(); await close_quietly() (after a failed open)
        puts        await append(batch, partition, rows_blob, key=None, arena=None, of=None) -> (first, count)
                    await recall(key) -> (first, count) | None        a retried put's first result
        flushing    await flush(); flush_soon() (the arena needs space); await maintain()
        records     count(); await read(offset, limit); await read_window(offset, limit);
                    await wait_beyond(index, timeout) -> bool
        samples     await take(partition, task, batch_size, timeout, sampler, lease, fields, request_key, **kw)
                    await mark_consumed(...); reset_consumption(...); give_back(partition, task, indexes);
                    await clear(partition, indexes) -> int
                    await set_tags(partition, items); await partitions(); not_cleared(indexes)
                    await describe(indexes, lenient); await sample_rows(indexes, fields);
                    await plain_values(indexes, names); await field_index()
        arena       arena_runs(indexes, fields); forget_arena(extent_id); ArenaPayload for append's ``arena``
        state       name, path, config, kinds, metrics, next_index, visible_upto, flushed_upto; await stats()
        keys        keys: KeyIndex (keys.py): await put(partition, keys, tags, batch, rows_blob, key, arena),
                    lookup(partition, keys), names(partition, indexes), listing(partition), clear(partition, keys)
    TopicConfig, DURABILITY_MODES, Metrics      settings and counters
    stored_topics(storage_path, backend_kwargs) the topics on disk with their creation settings
    arena_ranges(topic_path, generation)        the arena ranges a topic's unflushed log frames point to (read only)
    write_json_atomic(path, obj), fsync_dir(path)   a file replaced whole and synced, a folder's entries synced
    parse_location(storage_path, storage_options, local_path) -> Location   a folder or an object-store URI
    object_store_topic(location, name, topic_dirname(name))  the object-store side of a topic (or None),
                                                Topic's ``remote``: lease, settings and schema in the store
    sampler_from_wire(value)                    a built-in sampler from its wire form (the broker runs no other)
    caller_thread(), blocking_allowed()         engine code run inline in a blocking caller's thread (inline.py)
    check_key(key), check_keys(keys, tags), shared_fields(runs)   argument checks a client runs too (args.py)

Every call runs on one event loop (embedded mode: ``client/_loop.py``'s engine loop; the broker's own loop), so
the engine needs no locks: the steps between two ``await`` are atomic. How a topic is built: ``topic.py``.

Each name loads its module on first use (``__getattr__`` below): a client of a broker uses the settings, the
samplers and the argument checks, and never loads the topic, its log and its storage (nor Lance: the backend is
chosen at an embedded open, ``client/handle.py``). Embedded-only code reaches the rest as ``engine.Topic``.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .arena_refs import arena_ranges
    from .args import check_key, check_keys, shared_fields
    from .config import DURABILITY_MODES, Metrics, TopicConfig
    from .fields import FieldIndex
    from .inline import blocking_allowed, caller_thread
    from .keys import KEY_COLUMN, KeyIndex
    from .layout import topic_dirname
    from .location import Location, ObjectStoreTopic, object_store_topic, parse_location
    from .opening import ArenaResolver, stored_topics
    from .samplers import from_wire as sampler_from_wire
    from .spooled import new_part as new_spool_part
    from .spooled import put_spooled
    from .spooled import sweep as sweep_spool
    from .spooled import where as spool_where
    from .tail import ArenaPayload
    from .topic import BackendFactory, Topic

# Each name from the module that defines it, loaded on first use: a broker-mode client needs the config, the
# samplers and a few checks, not the topic and its storage machinery (about 40 modules, 0.1-0.2 s of a process's
# start; README's "Process start").
_EXPORTS = {
    "arena_ranges": ("arena_refs", "arena_ranges"),
    "fsync_dir": ("wal", "fsync_dir"),
    "write_json_atomic": ("layout", "write_json_atomic"),
    "DURABILITY_MODES": ("config", "DURABILITY_MODES"),
    "Metrics": ("config", "Metrics"),
    "TopicConfig": ("config", "TopicConfig"),
    "FieldIndex": ("fields", "FieldIndex"),
    "blocking_allowed": ("inline", "blocking_allowed"),
    "caller_thread": ("inline", "caller_thread"),
    "KEY_COLUMN": ("keys", "KEY_COLUMN"),
    "KeyIndex": ("keys", "KeyIndex"),
    "check_key": ("args", "check_key"),
    "check_keys": ("args", "check_keys"),
    "shared_fields": ("args", "shared_fields"),
    "topic_dirname": ("layout", "topic_dirname"),
    "Location": ("location", "Location"),
    "ObjectStoreTopic": ("location", "ObjectStoreTopic"),
    "object_store_topic": ("location", "object_store_topic"),
    "parse_location": ("location", "parse_location"),
    "ArenaResolver": ("opening", "ArenaResolver"),
    "stored_topics": ("opening", "stored_topics"),
    "sampler_from_wire": ("samplers", "from_wire"),
    "new_spool_part": ("spooled", "new_part"),
    "put_spooled": ("spooled", "put_spooled"),
    "sweep_spool": ("spooled", "sweep"),
    "spool_where": ("spooled", "where"),
    "ArenaPayload": ("tail", "ArenaPayload"),
    "BackendFactory": ("topic", "BackendFactory"),
    "Topic": ("topic", "Topic"),
}


def __getattr__(name: str) -> Any:
    found = _EXPORTS.get(name)
    if found is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{found[0]}"), found[1])
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "DURABILITY_MODES",
    "KEY_COLUMN",
    "ArenaPayload",
    "ArenaResolver",
    "BackendFactory",
    "FieldIndex",
    "KeyIndex",
    "Location",
    "Metrics",
    "ObjectStoreTopic",
    "Topic",
    "TopicConfig",
    "arena_ranges",
    "blocking_allowed",
    "caller_thread",
    "check_key",
    "check_keys",
    "fsync_dir",
    "new_spool_part",
    "object_store_topic",
    "parse_location",
    "put_spooled",
    "sampler_from_wire",
    "shared_fields",
    "spool_where",
    "stored_topics",
    "sweep_spool",
    "topic_dirname",
    "write_json_atomic",
]
