"""A client process for broker tests. Usage: python broker_client_worker.py ADDRESS ROLE ARGS...

produce TOPIC WORKER N BATCH   put N records {"id": "<worker>:<k>"} in put_batch(BATCH), print ACK lines
consume TOPIC N TIMEOUT        stream records from offset 0 with wait=True until N seen; print the ids
wake TOPIC OFFSET              wait for the record at OFFSET; print the monotonic time it arrived
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from persisting import Queue


async def main() -> None:
    address, role, topic, *rest = sys.argv[1:]
    async with Queue(topic, broker=address) as q:
        if role == "produce":
            worker, n, batch = rest[0], int(rest[1]), int(rest[2])
            for start in range(0, n, batch):
                ids = [f"{worker}:{k}" for k in range(start, min(n, start + batch))]
                await q.put_batch([{"id": x, "w": worker} for x in ids])
                os.write(1, ("ACKS " + " ".join(ids) + "\n").encode())
        elif role == "consume":
            want, timeout = int(rest[0]), float(rest[1])
            seen = 0
            async for chunk in q.stream(offset=0, wait=True, timeout=timeout):
                for r in chunk:
                    os.write(1, f"GOT {r['id']}\n".encode())
                seen += len(chunk)
                if seen >= want:
                    break
        elif role == "wake":
            offset = int(rest[0])
            print("WAITING", flush=True)
            async for _chunk in q.stream(limit=1, offset=offset, wait=True, timeout=30):
                print(f"WOKE {time.monotonic()}", flush=True)


asyncio.run(main())
