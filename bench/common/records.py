"""The benchmark's records: small dicts of about 100 bytes, the same for every store."""

from __future__ import annotations

from typing import Any

import numpy as np

PUT_BATCH = 1_000  # records per put_batch (persisting) and per commit / ack (peers, where they have one)
TEXT_CHARS = 70
_ALPHABET = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 .,-_", dtype=np.uint8)


def make_records(n: int, seed: int = 0, start: int = 0) -> list[dict[str, Any]]:
    """``n`` records ``{"id": start + i, "text": 70 random ASCII chars, "score": float in [0, 1)}``."""
    rng = np.random.default_rng(seed + start)
    codes = rng.integers(0, len(_ALPHABET), size=n * TEXT_CHARS, dtype=np.int64)
    text = _ALPHABET[codes].tobytes().decode("ascii")
    scores = rng.random(n).tolist()
    return [
        {"id": start + i, "text": text[i * TEXT_CHARS : (i + 1) * TEXT_CHARS], "score": scores[i]} for i in range(n)
    ]


def check_page(page: list[dict[str, Any]], first_id: int) -> int:
    """Raise unless ``page`` holds consecutive ids from ``first_id``; returns the next expected id."""
    if page and (page[0]["id"] != first_id or page[-1]["id"] != first_id + len(page) - 1):
        raise AssertionError(
            f"read back ids {page[0]['id']}..{page[-1]['id']}, expected {first_id}..{first_id + len(page) - 1}"
        )
    return first_id + len(page)
