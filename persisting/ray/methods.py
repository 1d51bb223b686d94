"""Which ``Queue`` methods ``persisting.ray`` forwards to the broker that owns a partition: the one list to extend.

A method of ``persisting.Queue`` that names its partition (a ``partition_id`` argument, else a ``BatchMeta`` of
one partition) is forwarded by adding one line to ``ROUTED``: ``persisting.ray.Queue`` and ``SyncQueue`` gain it
(``queue._routed``) and every node's actor serves it (``NodeBroker.call`` runs nothing else). The value says
whether the call writes: a writing call claims its partition for the caller's node when nobody owns it yet; any
other call on an unowned partition returns None without a round trip.
"""

from __future__ import annotations

ROUTED: dict[str, bool] = {
    "put_batch": True,
    "check_ready": False,
    "set_custom_meta": False,
    "mark_consumed": False,
    "reset_consumption": False,
    # the engine's key index (client/keyed.py): a kv_put claims; kv_list needs its partition_id here (one owner)
    "kv_put": True,
    "kv_get": False,
    "kv_list": False,
    "kv_clear": False,
    "kv_names": False,
}

# Forwarded with handling of their own in ``queue.py`` (tensors packed for Ray, waits, several owners).
SPECIAL = ("put", "get_meta", "get_data", "get_batch", "clear", "partitions", "flush")

REMOTE_METHODS = frozenset(ROUTED) | frozenset(SPECIAL)
