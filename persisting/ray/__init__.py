"""persisting on a Ray cluster: one broker per node, started and supervised by Ray, one ``Queue`` API everywhere.

    import ray, persisting.ray as pray
    ray.init(address="auto")
    pray.start("/shared/persisting")            # one broker actor per alive node, and the registry
    # or pray.start("s3://bucket/prefix", storage_options={...}, local_root="/var/lib/persisting")
    # in any task, on any node:
    q = pray.SyncQueue("rollouts")
    q.put({"obs": obs}, partition_id="step-7")    # claims step-7 for this node's broker: arena, no copy
    data, meta = q.get_batch(["obs"], 64, "train", "step-7", wait=True, timeout=30)   # from any node

Same-node calls go to the node's broker over ipc (arena views, as on one node); calls on a partition another
node owns run on that node's actor, and arrays come back through Ray's object store. Ownership, transfer and
failure semantics: the docs' "More than one node (Ray)" guide. Needs the ``ray`` extra; this package imports Ray
only when used.
"""

from .cluster import node_actor, node_key, registry, start, stop
from .queue import Queue
from .sync import SyncQueue

__all__ = ["Queue", "SyncQueue", "node_actor", "node_key", "registry", "start", "stop"]
