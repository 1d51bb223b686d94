"""``python -m bench sizes`` (issue 31): one tensor batch at each size from 1 MiB to 4 GiB, producer process ->
consumer process, through a broker with its default settings, beside ``torch.multiprocessing.Queue`` and memcpy of
the same bytes in the same run; then a steady stream of 1 GiB batches; GB/s against the size.

Decisions (docs/benchmarks/sizes.md says the same for readers):

- **Systems.** *persisting*: one broker subprocess with the DEFAULT settings (``bench/common/broker_process.py``, no
  ``--arena-bytes``: whatever shared memory the broker has by default), producer and consumer each a spawned
  process with a ``persisting.SyncQueue(topic, broker=address)`` (default ``durability``); the producer ``put``s
  ``{"x": tensor}``, the consumer ``get_batch(["x"], 64, wait=True)`` (take and data in one round trip, as
  ``bench/arena/persisting_peer.py`` reads). *torch.mp*: ``torch.multiprocessing.Queue`` (spawn), the producer puts
  a fresh ``share_memory_()`` tensor with the source copied in (``bench/common/torch_shared.py``), the consumer
  ``get``s it. *memcpy*: the source copied (``dst[:] = src``) into memory faulted in beforehand, in the producer,
  then touched like a result: the reference. *bound*: one memcpy plus one protocol ``hello`` round trip (blocking,
  as ``SyncQueue`` calls; the median of ``--hellos`` measured in the run): the fastest any broker hand-over of
  one copy and one round trip could go, the floor that round trips set for small batches.
- **The batch.** One field ``x``, a torch uint8 tensor of 64 samples (``size / 64`` bytes each, at every size, so
  that per-sample work is the same everywhere), built and written in the producer before any timing; the same
  source serves every system at that size. One topic per size.
- **One hand-over** = from the producer starting its put (source in memory; the consumer already waiting) until
  the consumer has the batch and has read one byte of each 4 KiB page of it (the same code for every system),
  ``time.monotonic()`` on both sides (one clock on Linux). GB/s = bytes / that time. The consumer holds the result
  until then (and until its peak RSS is read), then drops it. Between hand-overs the producer's persisting queue
  ``flush()``es (untimed), so that each one starts on a quiet broker.
- **Repetitions.** First of all one untimed 1 MiB hand-over per system (each process's first get and put import
  what they use). Per size: one warm-up hand-over per system, reported as *first* (the cold case), then
  ``--reps`` measured ones; medians, and the ratios persisting/torch.mp and persisting/memcpy of the medians of
  the same run. The systems alternate within each repetition.
- **The stream.** ``--stream-batches`` batches of ``--stream-bytes`` back to back: the producer puts as fast as
  the system lets it (persisting: each put returns once acknowledged; torch.mp: a queue of ``maxsize=2``, or its
  shared memory would hold every batch at once), the consumer takes each, touches every page and drops it before
  the next. GB/s = all bytes / (first put started -> last batch touched); memcpy of one batch beside it.
- **Memory.** The broker's VmRSS and its parts (RssShmem: shared memory; RssFile: file pages it maps, e.g. spool
  files; RssAnon: its own), polled every 20 ms for the whole run (the peaks per size, flushes included, and for the
  stream), the shared memory against what the broker's ``hello`` names (a budget where it has one, else the
  arena's size); the consumer's peak RSS (VmHWM, reset before each hand-over) above its RSS before it: what it held.
- **Sizes** that /dev/shm or RAM cannot hold (source + shared copy + consumer's copy) are skipped with a line.
"""

from __future__ import annotations

import re
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common.broker_process import broker_process, log_lines
from bench.common.measure import RssPoll
from bench.harness.suite import BenchArgumentError
from persisting.client import _loop
from persisting.client.connection import connection

from .worker import GET_TIMEOUT_S, ROWS, STREAM_QUEUE_MAX, Pair, WorkerError

MiB = 1 << 20
DEFAULT_SIZES = "1M,6M,64M,256M,512M,1G,2G,4G"
SYSTEMS = ("persisting", "torch.mp")
MARGIN = 512 * MiB  # left free beyond what a size needs
_UNITS = {"": 1, "K": 1 << 10, "M": MiB, "G": 1 << 30}
Say = Callable[[str], None]  # a progress line


def parse_sizes(text: str) -> list[int]:
    """``"1M,6M,1G"`` (K, M, G: powers of 1024; a trailing ``B`` or ``iB`` allowed) -> bytes, multiples of 64."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMG]?)(?:i?B)?", part, re.IGNORECASE)
        if m is None:
            raise ValueError(f"not a size: {part!r} (e.g. 6M, 512MiB, 1G)")
        nbytes = int(float(m.group(1)) * _UNITS[m.group(2).upper()]) // ROWS * ROWS
        if nbytes < ROWS:
            raise ValueError(f"{part!r}: at least {ROWS} bytes (one per sample)")
        out.append(nbytes)
    return out


def label(nbytes: int) -> str:
    for unit, name in ((1 << 30, "GiB"), (MiB, "MiB"), (1 << 10, "KiB")):
        if nbytes >= unit:
            return f"{nbytes / unit:,.2f}".rstrip("0").rstrip(".") + f" {name}"
    return f"{nbytes} B"


@dataclass(slots=True)
class Case:
    """One system at one size (``mode`` "one": single hand-overs; "stream": ``batches`` back to back)."""

    system: str
    nbytes: int
    mode: str = "one"
    batches: int = 1
    first_s: float | None = None
    runs_s: list[float] = field(default_factory=list)
    put_s: list[float] = field(default_factory=list)  # the put alone: its start -> it returned
    held: int = 0  # the consumer's peak RSS above its RSS before the hand-over, the most of the measured ones
    broker: tuple[int, ...] = (0, 0, 0, 0)  # persisting: the broker's peak VmRSS, RssShmem, RssFile, RssAnon

    @property
    def gbps(self) -> float | None:
        return self.nbytes * self.batches / statistics.median(self.runs_s) / 1e9 if self.runs_s else None


@dataclass(slots=True)
class SizesResult:
    cases: list[Case] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    hello_us: list[float] = field(default_factory=list)
    broker_memory: dict[str, Any] = field(default_factory=dict)  # the numbers of hello's "arena" entry
    broker_log: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0

    def case(self, system: str, nbytes: int, mode: str = "one") -> Case | None:
        return next((c for c in self.cases if (c.system, c.nbytes, c.mode) == (system, nbytes, mode)), None)

    def to_json(self) -> list[dict[str, Any]]:
        return [{**asdict(c), "gbps": c.gbps} for c in self.cases]


def handover(pair: Pair, system: str, topic: str, partition: str, stamp: int) -> tuple[float, float, int]:
    """One batch producer -> consumer: (seconds from the put's start to every page touched, to the put's return,
    bytes the consumer held)."""
    pair.send("consumer", "get", system, topic, partition, stamp)
    pair.recv("consumer")  # ready: in its get
    _, t0, returned = pair.ask("producer", "put", system, topic, partition, stamp)
    _, t1, held = pair.recv("consumer")
    pair.ask("producer", "settle", system, topic)
    return t1 - t0, returned - t0, held


def free_bytes() -> tuple[int, int]:
    """(MemAvailable, free bytes of /dev/shm)."""
    avail = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            avail = int(line.split()[1]) * 1024
    return avail, shutil.disk_usage("/dev/shm").free


def room_for(nbytes: int, copies: int) -> str | None:
    """Why a batch of ``nbytes`` does not fit ``copies`` times in RAM (and once in /dev/shm); None: it fits."""
    ram, shm = free_bytes()
    if ram < copies * nbytes + MARGIN:
        return f"needs {label(copies * nbytes + MARGIN)} of RAM ({copies} copies + margin), {label(ram)} available"
    if shm < nbytes + MARGIN:
        return f"needs {label(nbytes + MARGIN)} free in /dev/shm, {label(shm)} free"
    return None


def measure_size(pair: Pair, nbytes: int, reps: int, poll: RssPoll, say: Say) -> list[Case]:
    """Every system at one size: a warm-up hand-over each (``first``), then ``reps`` rounds of them all."""
    topic = f"size-{nbytes}"
    start(pair, topic, nbytes)
    cases = {s: Case(s, nbytes) for s in (*SYSTEMS, "memcpy")}
    poll.take()
    for rep in range(-1, reps):
        for system in SYSTEMS:
            seconds, put_s, held = handover(pair, system, topic, f"r{rep + 1}", (rep + 2) % 256)
            case = cases[system]
            if rep < 0:
                case.first_s = seconds  # its held bytes count the first get's imports and mappings: not kept
            else:
                case.runs_s.append(seconds)
                case.put_s.append(put_s)
                case.held = max(case.held, held)
            say(f"{label(nbytes)} {system} {'first' if rep < 0 else f'rep {rep + 1}'}: {seconds * 1e3:,.1f} ms")
        if rep >= 0:
            cases["memcpy"].runs_s.append(pair.ask("producer", "memcpy")[1])
    cases["persisting"].broker = poll.take()
    done(pair, topic)
    return list(cases.values())


def start(pair: Pair, topic: str, nbytes: int) -> None:
    """Both processes open ``topic``; the producer builds its source of ``nbytes`` (untimed)."""
    for role in ("producer", "consumer"):
        pair.ask(role, "open", topic)
    pair.ask("producer", "source", nbytes)


def done(pair: Pair, topic: str) -> None:
    """The producer drops its source; both close ``topic`` (its spare extent, its holds go back to the broker)."""
    pair.ask("producer", "free")
    for role in ("producer", "consumer"):
        pair.ask(role, "close", topic)


def _prime(pair: Pair) -> None:
    """One untimed 1 MiB hand-over per system first: each process's first get and put import and connect what
    they use (about a second), which is no size's cold case."""
    start(pair, "prime", MiB)
    for system in SYSTEMS:
        handover(pair, system, "prime", "p", 1)
    done(pair, "prime")


def measure_stream(pair: Pair, nbytes: int, batches: int, reps: int, poll: RssPoll, say: Say) -> list[Case]:
    start(pair, "stream", nbytes)
    memcpy = Case("memcpy", nbytes, "stream")
    memcpy.runs_s = [pair.ask("producer", "memcpy")[1] for _ in range(reps)]
    out = [memcpy]
    for system in SYSTEMS:
        poll.take()
        pair.send("consumer", "stream", system, "stream", batches)
        pair.recv("consumer")  # ready
        pair.send("producer", "stream", system, "stream", batches)
        _, t0, _last_put = pair.recv("producer", GET_TIMEOUT_S * batches)
        _, t1, held = pair.recv("consumer", GET_TIMEOUT_S * batches)
        pair.ask("producer", "settle", system, "stream")
        case = Case(system, nbytes, "stream", batches, runs_s=[t1 - t0], held=held)
        broker = poll.take()
        if system == "persisting":
            case.broker = broker
        out.append(case)
        say(f"stream {batches} x {label(nbytes)} {system}: {(t1 - t0):,.2f} s")
    done(pair, "stream")
    return out


def hellos(address: str, n: int, warmup: int = 20) -> tuple[list[float], dict[str, Any]]:
    """``n`` protocol ``hello`` round trips from a blocking caller (SyncQueue's path, as ``bench broker`` times
    it), in microseconds; and the numbers of the reply's ``arena`` entry (the broker's shared memory), with the
    budget its ``arena_stats`` name where the broker has one (segments within a budget)."""

    async def hello() -> Any:
        return (await connection(address).request("hello", {})).result

    first = _loop.run(hello())
    for _ in range(warmup):
        _loop.run(hello())
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        _loop.run(hello())
        out.append((time.perf_counter_ns() - t0) / 1e3)
    shm = {**(first.get("arena") or {}), **{k: v for k, v in (first.get("arena_stats") or {}).items() if "budget" in k}}
    return out, {k: v for k, v in shm.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def run_sizes_bench(
    base: Path, sizes: list[int], reps: int, stream_bytes: int, stream_batches: int, hello_n: int, progress: bool
) -> SizesResult:
    result = SizesResult()
    t_start = time.monotonic()

    def say(line: str) -> None:
        if progress:
            print(f"sizes: {line}", file=sys.stderr, flush=True)

    (base / "s").mkdir(parents=True)
    address = f"ipc://{base / 's' / 'b.sock'}"
    log_path = base / "broker.log"
    with broker_process(base / "storage", address, log_path, (), "WARNING") as broker:
        result.hello_us, result.broker_memory = hellos(address, hello_n)
        poll = RssPoll(broker.pid)
        poll.start()
        pair = Pair(address)
        try:
            _measure_all(pair, result, sizes, reps, stream_bytes, stream_batches, poll, say)
        except WorkerError as exc:
            result.skipped.append(f"run stopped: {exc}")
        finally:
            pair.close()
            poll.stop()
    result.broker_log = log_lines(log_path)
    result.wall_s = time.monotonic() - t_start
    return result


def _measure_all(
    pair: Pair,
    result: SizesResult,
    sizes: list[int],
    reps: int,
    stream_bytes: int,
    stream_batches: int,
    poll: RssPoll,
    say: Say,
) -> None:
    _prime(pair)
    for nbytes in sizes:
        why = room_for(nbytes, 3)  # the producer's source + the shared copy + the consumer's copy
        if why is not None:
            result.skipped.append(f"{label(nbytes)}: skipped, {why}")
            say(result.skipped[-1])
            continue
        result.cases += measure_size(pair, nbytes, reps, poll, say)
    if stream_batches:
        why = room_for(stream_bytes, 2 + STREAM_QUEUE_MAX + 1)  # source, queued, being made, held
        if why is not None:
            result.skipped.append(f"stream of {label(stream_bytes)}: skipped, {why}")
            return
        result.cases += measure_stream(pair, stream_bytes, stream_batches, reps, poll, say)


def add_args(p: Any) -> None:
    """``python -m bench sizes``'s own options (the harness adds the common ones, ``--reps`` among them: measured
    hand-overs per size and system, after a warm-up one)."""
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"batch sizes, K/M/G = KiB/MiB/GiB (default {DEFAULT_SIZES})")
    p.add_argument("--stream-batches", type=int, default=8, help="batches of the steady stream (default 8; 0: none)")
    p.add_argument("--stream-bytes", default="1G", help="each stream batch (default 1G)")
    p.add_argument("--hellos", type=int, default=500, help="timed hello round trips of the bound (default 500)")


def settings(args: Any) -> tuple[list[int], int]:
    """The sizes and the stream batch, checked (``BenchArgumentError`` says what is wrong)."""
    try:
        sizes, (stream,) = parse_sizes(args.sizes), parse_sizes(args.stream_bytes)
    except ValueError as exc:
        raise BenchArgumentError(str(exc)) from None
    if args.stream_batches < 0 or args.hellos < 1:
        raise BenchArgumentError("--hellos must be at least 1, --stream-batches 0 or more")
    return sizes, stream
