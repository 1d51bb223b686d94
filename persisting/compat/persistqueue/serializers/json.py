"""JSON as UTF-8 bytes, one value per line in a file (persist-queue's ``serializers.json``)."""

from __future__ import annotations

import json
from typing import Any, BinaryIO


def dump(value: Any, fp: BinaryIO, sort_keys: bool = False) -> None:
    fp.write(json.dumps(value, sort_keys=sort_keys).encode("utf-8"))
    fp.write(b"\n")


def dumps(value: Any, sort_keys: bool = False) -> bytes:
    return json.dumps(value, sort_keys=sort_keys).encode("utf-8")


def load(fp: BinaryIO) -> Any:
    return json.loads(fp.readline().decode("utf-8"))


def loads(bytes_value: bytes) -> Any:
    return json.loads(bytes_value.decode("utf-8"))
