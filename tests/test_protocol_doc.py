"""The wire protocol's reference page is the request table's: generated from it (broker/requests/doc.py), and the
table covers every operation of the wire's catalogue (persisting/wire/requests.py) with its argument struct."""

from __future__ import annotations

from pathlib import Path

from broker.requests import doc
from broker.requests.table import ROUTES, TABLE
from persisting.wire.protocol import OPS
from persisting.wire.requests import REQUESTS

ROOT = Path(__file__).resolve().parent.parent


def test_the_table_routes_every_operation_once_with_its_struct() -> None:
    assert len(ROUTES) == len(TABLE), "an operation routed twice"
    assert set(TABLE) == set(REQUESTS) == OPS
    assert {op: route.args for op, route in TABLE.items()} == REQUESTS


def test_the_protocol_page_is_generated_from_the_table() -> None:
    page = (ROOT / doc.PAGE).read_text()
    assert page == doc.render(), "docs/reference/protocol.md is stale: run `python -m broker.requests.doc`"
    for route in ROUTES:
        assert f"### `{route.op}`" in page
