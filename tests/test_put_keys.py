"""A put's automatic idempotency key (broker mode) is a per-process uuid4 prefix and a counter: distinct within a
process, drawn anew in a forked child (whose counter starts again at 0, so a shared prefix would repeat keys the
parent sent), and a valid key for the log."""

from __future__ import annotations

import os

from persisting.client.remote import put_key
from persisting.engine.puts import check_key


def test_keys_are_distinct_and_valid() -> None:
    keys = [put_key() for _ in range(10_000)]
    assert len(set(keys)) == len(keys)
    for key in (keys[0], keys[-1]):
        check_key(key)
    assert len({k[:32] for k in keys}) == 1  # one prefix per process: the counter tells them apart


def test_a_forked_child_draws_its_own_prefix() -> None:
    parent = put_key()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no Lance, no loop; report one key and leave at once
        try:
            os.write(write_end, put_key().encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        child = os.read(read_end, 256).decode()
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    assert child and child[:32] != parent[:32]
