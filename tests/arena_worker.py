"""A client process for arena tests. Usage: python arena_worker.py ADDRESS ROLE TOPIC ARGS...

lease TOPIC NBYTES       lease an extent, write into it, print LEASED, then hang (to be killed mid-write)
hold TOPIC N             take N samples with get_meta/get_data, print HOLDING, then hang holding the views
produce TOPIC START:N    put tensor batches b = START..START+N-1 of 4 samples (x = b*4 + sample); print ACK FIRST b
take TOPIC N             get_meta batches of N for task "t" until 2 s pass with none; print TOOK i1 i2 ...
lease-samples TOPIC N    get_meta N samples for task "t" with delivery="ack" (a 10 min lease); print LEASED ..., hang
"""

from __future__ import annotations

import asyncio
import sys
import time

import numpy as np

from persisting import Queue
from persisting.client.connection import connection
from persisting.tensors.arena import peer_id


async def main() -> None:
    address, role, topic, arg = sys.argv[1:5]
    async with Queue(topic, broker=address) as q:
        if role == "lease":
            await q.open()
            reply = await connection(address).request("lease", {"nbytes": int(arg), "timeout": 5, "peer": peer_id()})
            print(f"LEASED {reply.result[0]}", flush=True)
            time.sleep(3600)
        elif role == "hold":
            data = await q.get_data(await q.get_meta(["x"], int(arg), "hold", "p"))
            print(f"HOLDING {len(data['x'])}", flush=True)
            time.sleep(3600)
        elif role == "lease-samples":
            meta = await q.get_meta(["x"], int(arg), "t", "p", delivery="ack", lease_seconds=600)
            print("LEASED " + " ".join(map(str, meta.global_indexes)), flush=True)
            time.sleep(3600)
        elif role == "take":
            while True:
                meta = await q.get_meta(["x"], int(arg), "t", "p", wait=True, timeout=2)
                if meta.size == 0:
                    break
                print("TOOK " + " ".join(map(str, meta.global_indexes)), flush=True)
        elif role == "produce":
            start, n = (int(v) for v in arg.split(":"))
            for b in range(start, start + n):
                x = np.arange(b * 4, b * 4 + 4, dtype=np.int64).repeat(256).reshape(4, 256)
                meta = await q.put({"x": x}, partition_id="p")
                print(f"ACK {meta.global_indexes[0]} {b}", flush=True)


asyncio.run(main())
