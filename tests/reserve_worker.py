"""A producer process for reservation tests. Usage: python reserve_worker.py ADDRESS TOPIC NBYTES

Reserves one sample of NBYTES uint8 bytes in partition "p" through ``Queue.reserve``, writes half of it, prints
``RESERVED <in_arena> <pid>``, then hangs without putting it (to be SIGKILLed holding the reservation).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

import numpy as np

from persisting import Queue


async def main() -> None:
    address, topic, nbytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
    async with Queue(topic, broker=address, zerocopy_mode="force") as q:
        r = await q.reserve({"x": ((nbytes,), np.uint8)}, batch_size=1, partition_id="p", timeout=10)
        r["x"][0, : nbytes // 2] = 0xAB  # killed mid-write
        print(f"RESERVED {r.in_arena} {os.getpid()}", flush=True)
        time.sleep(3600)


asyncio.run(main())
