"""One topic protocol in the client (persisting/client/topic_api.py): both kinds of topic implement it, and no
client module asks which kind it holds.

- ``mode_checks`` reads the client's modules (and the compat layers' one door into them, compat/_engine.py) and
  names every place that asks: ``isinstance``/``issubclass``/``type(...) is`` against a topic class, ``hasattr``
  on a topic, an import of a topic class outside the one factory (client/handle.py), a test of the broker
  address outside it, a reach through the embedded adapter to the engine's own topic. A test feeds it each of
  those once, so the check cannot pass by finding nothing.
- The real topics, an embedded one on a tmp dir and a broker's over a real broker subprocess, are checked against
  the protocol (every member there, the same parameters, async where the protocol is async) and driven through
  the same calls with the same results.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest

from persisting import Queue
from persisting.client.topic_api import KeysAPI, TopicAPI
from persisting.wire import codec

from .broker_fixture import BrokerProcess

ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "persisting" / "client"
CHECKED = [*sorted(CLIENT.glob("*.py")), ROOT / "persisting" / "compat" / "_engine.py"]
# The classes whose name in a check is a check of the mode.
TOPIC_CLASSES = {"RemoteTopic", "EmbeddedTopic", "Topic", "TopicAPI", "KeysAPI", "RemoteKeys", "EmbeddedKeys"}
# Where a topic class may be named: its own module, the protocol's, and the one factory that picks the mode.
MAY_IMPORT = {"handle.py", "remote.py", "embedded.py", "topic_api.py", "remote_keys.py", "remote_reads.py"}
TOPIC_NAMES = {"topic", "remote", "engine", "t"}


def _named(node: ast.AST) -> set[str]:
    """Class names in an isinstance target: ``X``, ``mod.X``, tuples and unions of them."""
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    if isinstance(node, ast.Tuple):
        return set().union(*(_named(e) for e in node.elts))
    if isinstance(node, ast.BinOp):
        return _named(node.left) | _named(node.right)
    return set()


def mode_checks(source: str, filename: str) -> list[str]:
    """Every place in ``source`` (a module of the client named ``filename``) that asks which kind of topic it has."""
    found = []
    for node in ast.walk(ast.parse(source)):
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            args = node.args
            if node.func.id in ("isinstance", "issubclass") and len(args) == 2 and _named(args[1]) & TOPIC_CLASSES:
                found.append(f"{where}: {node.func.id}(..., {ast.unparse(args[1])})")
            if node.func.id == "hasattr" and args and _named(args[0]) & TOPIC_NAMES:
                found.append(f"{where}: hasattr({ast.unparse(args[0])}, ...)")
        if isinstance(node, ast.Compare) and any(isinstance(op, ast.Is | ast.IsNot | ast.Eq) for op in node.ops):
            text = [ast.unparse(side) for side in (node.left, *node.comparators)]
            typed = any("type(" in side for side in text)  # type(x) is C, type(x).__name__ == "C"
            if typed and any(name in side for side in text for name in TOPIC_CLASSES):
                found.append(f"{where}: {ast.unparse(node)}")
        if isinstance(node, ast.Compare) and filename != "handle.py":
            sides = [node.left, *node.comparators]
            if any(isinstance(side, ast.Attribute) and side.attr == "broker" for side in sides):
                found.append(f"{where}: {ast.unparse(node)} (the broker address picks the mode in handle.py only)")
        if isinstance(node, ast.ImportFrom) and filename not in MAY_IMPORT:
            names = {a.name for a in node.names} & (TOPIC_CLASSES - {"TopicAPI", "KeysAPI"})
            if names:
                found.append(f"{where}: imports {sorted(names)} (use the TopicAPI the handle gives)")
        if isinstance(node, ast.Attribute) and node.attr == "engine_topic" and filename != "embedded.py":
            found.append(f"{where}: reaches the engine's topic through the embedded adapter")
    return found


def test_no_client_module_asks_which_kind_of_topic_it_has() -> None:
    found = [f for path in CHECKED for f in mode_checks(path.read_text(), path.name)]
    assert not found, "the client asks which kind of topic it has (call the TopicAPI instead):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "bad",
    [
        "if isinstance(topic, RemoteTopic):\n    pass",
        "ok = isinstance(t, remote.RemoteTopic | int)",
        "ok = not isinstance(topic, (engine.Topic, str))",
        "ok = issubclass(type(topic), EmbeddedTopic)",
        "ok = hasattr(topic, 'arena')",
        "ok = type(topic).__name__ == 'RemoteTopic'",
        "ok = type(topic) is RemoteTopic",
        "from .remote import RemoteTopic",
        "x = topic.engine_topic.kinds",
        "if self._handle.broker is not None:\n    pass",
    ],
)
def test_the_check_finds_each_way_of_asking(bad: str) -> None:
    assert mode_checks(bad, "data_api.py"), bad


def test_the_check_leaves_the_factory_and_capabilities_alone() -> None:
    fine = "from .remote import RemoteTopic\narena = topic.arena\nif arena is not None:\n    pass"
    assert mode_checks(fine, "handle.py") == []


# -- the real topics against the protocol -----------------------------------------------------------------


def _members(proto: type) -> dict[str, Any]:
    return {
        name: value
        for name, value in vars(proto).items()
        if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))
    }


def _conforms(obj: object, proto: type) -> list[str]:
    """What of ``proto`` ``obj`` lacks or has otherwise: members, parameter names in order, async or not."""
    wrong = []
    for name in (*_members(proto), *getattr(proto, "__annotations__", {})):
        if not hasattr(obj, name):
            wrong.append(f"{type(obj).__name__} lacks {name}")
    for name, spec in _members(proto).items():
        if isinstance(spec, property) or not hasattr(obj, name):
            continue
        impl = getattr(obj, name)
        want = list(inspect.signature(spec).parameters)[1:]  # without self
        got = list(inspect.signature(impl).parameters)
        if got != want:
            wrong.append(f"{type(obj).__name__}.{name}{got}: the protocol's parameters are {want}")
        if inspect.iscoroutinefunction(spec) != _awaitable(impl):
            wrong.append(f"{type(obj).__name__}.{name}: async must match the protocol's")
    return wrong


def _awaitable(method: Any) -> bool:
    """Async, or a plain method that hands a coroutine on (annotated to return one)."""
    if inspect.iscoroutinefunction(method):
        return True
    returns = inspect.signature(method).return_annotation
    return isinstance(returns, str) and returns.startswith("Coroutine[")


async def _drive(topic: TopicAPI) -> dict[str, Any]:
    """The same calls on either kind; what they give, in a form both must match."""
    kinds = dict(topic.kinds)
    batch = codec.encode_batch([{"id": i, "x": float(i)} for i in range(3)], kinds)
    first, n = await topic.append(batch, "p", codec.pack(batch.rows), topic.new_put_key())
    await topic.flush()
    rows, read_kinds, end = await topic.read_window(0, 10)
    waited = await topic.read_waiting(3, 10, 0.05)
    indexes, descs = await topic.take("p", "t", 2, 0.0, None, {}, None, None)
    await topic.mark_consumed("p", "t", indexes)
    keyed, _runs = await topic.keys.put("k", ["a"], [{"tag": 1}], None, None, None)
    return {
        "put": (first, n),
        "count": await asyncio.to_thread(topic.current_count),  # count() over a broker: as last seen
        "rows": codec.decode_rows(rows, read_kinds),
        "end": end,
        "waited": waited[0],
        "taken": indexes,
        "described": len(descs),
        "beyond": await topic.wait_beyond(0, 0.0),
        "partitions": sorted(await topic.partitions()),
        "names": await topic.keys.names("k", keyed),
        "listing": await topic.keys.listing("k"),
        "has arena": topic.arena is not None,
        "exclusive": topic.exclusive,
    }


def _check(q: Queue) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        async with q:
            topic = q._handle.opened
            assert isinstance(topic, TopicAPI) and isinstance(topic.keys, KeysAPI)  # runtime_checkable: members
            assert _conforms(topic, TopicAPI) == []
            assert _conforms(topic.keys, KeysAPI) == []
            return await _drive(topic)

    return asyncio.run(main())


def test_both_kinds_of_topic_implement_the_protocol_alike(tmp_path: Path, broker: BrokerProcess) -> None:
    embedded = _check(Queue("proto", storage_path=tmp_path / "embedded"))
    remote = _check(Queue("proto", broker=broker.address))
    assert embedded.pop("has arena") is False and remote.pop("has arena") is True
    assert embedded.pop("exclusive") is True and remote.pop("exclusive") is False
    assert embedded == remote
    assert embedded["put"] == (0, 3) and embedded["taken"] == [0, 1] and embedded["names"] == ["a"]
