"""A client written to do harm, on a raw ZeroMQ socket: it names pid 1 (a process that never exits) as the owner
of what it leases and holds, takes views of every sample it is told and never releases them, and leases arena
space until refused. Prints one JSON line of what it got, then waits to be killed.

    python raw_peer_worker.py <address> <topic> <first index> <count>
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import zmq

from persisting.wire import protocol
from persisting.wire.protocol import Request

LEASE_BYTES = 512 * 1024


def _pid1() -> list[int]:
    with open("/proc/1/stat", "rb") as f:
        return [1, int(f.read().rsplit(b")", 1)[-1].split()[19])]


def main() -> None:
    address, topic, first, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(address)
    ids = iter(range(1, 10**6))

    def ask(op: str, args: dict[str, Any]) -> dict[str, Any]:
        sock.send_multipart(protocol.encode_request(Request(next(ids), op, {**args, "peer": _pid1()})))
        if not sock.poll(20_000):
            raise TimeoutError(op)
        reply = protocol.decode_reply(sock.recv_multipart())
        return {"ok": reply.ok, "result": reply.result, "error": reply.error_type}

    got = ask("get_data", {"topic": topic, "config": {}, "indexes": list(range(first, first + count)), "fields": ["x"]})
    held = isinstance(got["result"], dict) and "hold" in got["result"]
    leases = 0
    for _ in range(64):
        reply = ask("lease", {"nbytes": LEASE_BYTES, "timeout": 0.2})
        if not reply["ok"]:
            break
        leases += 1
    print(json.dumps({"held": held, "leases": leases, "last": reply["error"]}), flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    main()
