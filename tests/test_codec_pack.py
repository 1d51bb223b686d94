"""codec.pack (msgspec) writes the bytes msgpack-python wrote before it, for every plain value: the write-ahead
logs, rows on the wire and stored frames of earlier versions stay the same bytes."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from persisting.wire import codec

plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(plain)
def test_pack_writes_what_msgpack_python_wrote(value: object) -> None:
    assert codec.pack(value) == msgpack.packb(value, use_bin_type=True)
    assert msgpack.unpackb(codec.pack(value), raw=False, strict_map_key=False) == value


def test_a_row_page_and_a_frame_header() -> None:
    rows = [{"id": i, "v": "x" * 100, "b": b"\x00\xff", "f": 0.5, "n": None, "t": True} for i in range(100)]
    header = ["p", {"id": "int", "v": "str"}, "key-1", None, [[1, 2], ["v"]]]
    for value in (rows, header, float("nan")):
        assert codec.pack(value) == msgpack.packb(value, use_bin_type=True)


def test_the_codec_knows_tensors_only_through_the_registered_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from persisting.errors import ConfigError, CorruptionError
    from persisting.tensors import dtypes
    from persisting.wire import tensor_kinds

    stored = codec.encode_sample("tensor", "float32", np.arange(3, dtype=np.float32))
    assert isinstance(tensor_kinds.registered(), dtypes.TorchKinds)  # import persisting registered torch's
    dtype_name, host = codec.decode_sample("tensor", stored)
    assert (dtype_name, host.tolist()) == ("float32", [0.0, 1.0, 2.0])
    with pytest.raises(CorruptionError, match="cannot be decoded"):
        codec.decode_sample("tensor", b"\xc1")

    monkeypatch.setattr(tensor_kinds, "_registered", [])
    with pytest.raises(ConfigError, match=r"no tensor kinds are registered.*import persisting"):
        codec.decode_sample("tensor", stored)
    assert codec.decode_rows([{"a": codec.encode_value([1, (2,)], "nested", "a")}], {"a": "nested"}) == [
        {"a": [1, (2,)]}
    ]
