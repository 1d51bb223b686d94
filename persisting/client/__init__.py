"""The client side: ``Queue`` (embedded, or a thin client of the broker), its sync twin, the data API, KV and
the torch loader.

::

    queue.py           Queue: the one API; embedded it drives engine.Topic on the engine loop (_loop.py),
                       with a broker it talks through remote.RemoteTopic
    data_api.py        get_meta / get_data / get_batch / clear / tags, on either kind of topic
    remote.py          broker mode: one DEALER socket, retries, reconnects (wire/protocol.py)
    remote_tensors.py  broker mode, tensor batches: leases, writes into the arena, views out of it
    sync.py            SyncQueue / SyncReservation: the blocking twins, made in one place
    kv.py              KVInterface: keyed state over a topic
    loader.py          StreamingDataset: a torch IterableDataset over get_batch
"""

from .kv import KVInterface
from .queue import Queue
from .sync import SyncQueue, SyncReservation

__all__ = ["KVInterface", "Queue", "SyncQueue", "SyncReservation"]
