"""The client side: ``Queue`` (embedded, or a thin client of the broker), its sync twin, the data API, KV and
the torch loader.

::

    queue.py           Queue: the one API, assembled from a TopicHandle (handle.py: settings, counters, and the
                       one place that picks the mode) with data_api.py (get_meta / get_data / get_batch / clear /
                       tags), tensor_puts.py (tensor puts, reservations), keyed.py (kv_*), big_batches.py
    topic_api.py       TopicAPI / KeysAPI: the one interface those modules drive a topic through (the contract)
    embedded.py        EmbeddedTopic: the engine's Topic in this process, on the engine loop (_loop.py);
                       the per-process registry of embedded topics
    remote.py          RemoteTopic: a broker's topic, one request per call over connection.py (one DEALER
                       per loop, retries, reconnects); remote_reads.py (its data reads), remote_keys.py (its
                       keyed samples), remote_tensors.py (ArenaClient: leases, writes into the arena, views)
    sync.py            SyncQueue / SyncReservation: the blocking twins, made in one place (blocking.py: a
                       blocking caller's own socket to a broker)
    kv.py              KVInterface: keyed state over a topic
    loader.py          StreamingDataset: a torch IterableDataset over get_batch
"""

from .kv import KVInterface
from .queue import Queue
from .sync import SyncQueue, SyncReservation

__all__ = ["KVInterface", "Queue", "SyncQueue", "SyncReservation"]
