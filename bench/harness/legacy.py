"""The benches not yet on the harness, run as before: the argparse subcommands and the benches that parse their
own arguments. Each entry leaves ``NAMES`` (and its code this file) when its suite moves to a folder of bench/
with a ``SUITE``; once ``NAMES`` is empty this file goes."""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import persisting
from bench import plots
from bench.arena_batches import POOL
from bench.arena_bench import run_arena_bench
from bench.arena_report import render_arena
from bench.broker_bench import run_broker_bench
from bench.broker_report import render_broker
from bench.layout import FORMATS
from bench.queue_bench import run_queue_bench
from bench.report import render
from bench.samples_bench import run_samples_bench
from bench.samples_report import render_samples

PACKAGES = ("persisting", "pylance", "pyarrow", "numpy", "msgpack", "persist-queue", "tqdm")


def _versions() -> str:
    out = []
    for name in PACKAGES:
        try:
            out.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{name} (not installed)")
    return ", ".join(out)


def _git_revision() -> str:
    """The checkout's commit, with "+ local changes" when persisting/ differs from it."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "persisting"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + (" + local changes in persisting/" if dirty else "")


def _common_args(p: argparse.ArgumentParser) -> None:
    """The options every benchmark takes, after its own."""
    p.add_argument("--format", choices=FORMATS, default="console")
    p.add_argument("--dir", type=Path, help="work under this folder (default: a temp dir in /tmp), removed after")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    _plot_arg(p)


def _plot_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plot", type=Path, metavar="DIR", help="also write PNG charts of the run to DIR (matplotlib)")


def _plots(folder: Path | None, make: Any, result: Any) -> None:
    """Write the run's charts when ``--plot DIR`` was given; their paths go to stderr (stdout holds the table)."""
    if folder is not None:
        for path in make(result, folder):
            print(f"wrote {path}", file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = parser.add_subparsers(dest="bench", required=True)
    # queue: the options _common_args adds, but --format and --dir before its own (the order --help shows)
    q = sub.add_parser("queue", help="persisting Queue vs persist-queue: write, read, flush cost")
    q.add_argument("--n", type=int, action="append", help="record count; repeat for several (default 10000)")
    q.add_argument("--format", choices=FORMATS, default="console")
    q.add_argument("--dir", type=Path, help="work under this folder (default: a temp dir in /tmp), removed after")
    q.add_argument("--peer-limit-s", type=float, default=180.0, help="skip a peer projected slower than this")
    q.add_argument("--flush-prefill", type=int, default=1_000_000, help="rows stored before the flush test; 0: skip")
    q.add_argument("--flush-reps", type=int, default=20, help="timed flushes per topic")
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    _plot_arg(q)
    b = sub.add_parser(
        "broker", help="persisting-broker: put round trip vs raw ZeroMQ; 2x2 processes vs persist-queue SQLiteAckQueue"
    )
    b.add_argument("--latency-n", type=int, default=2_000, help="timed sequential requests per latency series")
    b.add_argument("--warmup", type=int, default=200, help="untimed requests per latency series first")
    b.add_argument(
        "--records", type=int, default=200_000, help="records through the broker per 2x2 run (multiple of 200)"
    )
    b.add_argument(
        "--durability",
        action="append",
        choices=("sync", "process"),
        help="2x2 runs through the broker; repeat for several (default: sync and process)",
    )
    b.add_argument("--pq-records", type=int, default=20_000, help="records in the persist-queue 2x2 run; 0: skip")
    b.add_argument("--pq-limit-s", type=float, default=20.0, help="time limit of each persist-queue worker")
    _common_args(b)
    a = sub.add_parser(
        "arena",
        help="tensor batches producer -> consumer through the broker's shared-memory arena vs memcpy and "
        "torch.multiprocessing.Queue",
    )
    a.add_argument("--small-batches", type=int, default=256, help="6 MiB batches per stream run (default: 1.5 GiB)")
    a.add_argument("--large-batches", type=int, default=24, help="64 MiB batches per stream run (default: 1.5 GiB)")
    a.add_argument("--paced-batches", type=int, default=16, help="batches per paced (idle pipe) latency run; 0: skip")
    a.add_argument("--arena-bytes", type=int, default=2 * 1024**3, help="the broker's arena (default 2 GiB)")
    a.add_argument(
        "--beyond-batches", type=int, default=128, help="6 MiB batches through a small arena (see next); 0: skip"
    )
    a.add_argument(
        "--beyond-arena-bytes", type=int, default=256 * 1024**2, help="arena of the beyond run (default 256 MiB)"
    )
    a.add_argument(
        "--in-flight",
        type=int,
        default=2,
        help=f"puts the in-flight stream row keeps running on one Queue (2-{POOL}; default 2); 1: no such row",
    )
    a.add_argument("--no-torch", action="store_true", help="skip the torch.multiprocessing.Queue reference")
    a.add_argument("--no-transferqueue", action="store_true", help="skip the TransferQueue rows (Ray)")
    a.add_argument(
        "--consumer-reads",
        action="store_true",
        help="consumers read every byte of each batch before counting it received (the cost of using the data)",
    )
    _common_args(a)
    s = sub.add_parser(
        "samples",
        help="get_meta (GRPOGroupNSampler) through the broker: 2 producers, 4 consumers of one task, vs the "
        "protocol's hello round trip",
    )
    s.add_argument("--puts", type=int, default=250, help="puts of 64 samples per producer (default 250)")
    s.add_argument(
        "--put-interval-ms", type=float, default=0.0, help="each producer puts once per this many ms (0: flat out)"
    )
    s.add_argument("--latency-n", type=int, default=2_000, help="timed calls per reference series (hello, get_meta)")
    s.add_argument("--warmup", type=int, default=200, help="untimed calls per reference series first")
    s.add_argument("--get-timeout", type=float, default=0.5, help="the consumers' get_meta(wait=True, timeout=...)")
    _common_args(s)
    o = sub.add_parser("storage", help="flush and read throughput: a topic on a local S3 server (moto) vs local disk")
    o.add_argument("--records", type=int, default=100_000, help="small records per run (default 100000)")
    o.add_argument("--tensors", type=int, default=512, help="tensor records per run (default 512)")
    o.add_argument("--tensor-kib", type=int, default=256, help="KiB of float32 per tensor record (default 256)")
    o.add_argument("--reps", type=int, default=3, help="runs per store and workload, medians reported (default 3)")
    o.add_argument("--dir", type=Path, help="work under this folder (default: a temp dir in /tmp), removed after")
    o.add_argument("--seed", type=int, default=0)
    j = sub.add_parser(
        "jagged", help="jagged int64 token batches through the broker vs padded and vs torch.multiprocessing.Queue"
    )
    j.add_argument("--samples", type=int, default=256, help="sequences per batch (default 256)")
    j.add_argument("--min-len", type=int, default=100, help="shortest sequence (default 100)")
    j.add_argument("--max-len", type=int, default=4000, help="longest sequence, the padded width (default 4000)")
    j.add_argument("--batches", type=int, default=32, help="batches per run (default 32)")
    j.add_argument("--reps", type=int, default=3, help="runs per case, medians reported (default 3)")
    j.add_argument("--dir", type=Path, help="work under this folder (default: a temp dir in /tmp), removed after")
    j.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("ray", help="cross-node tensor hand-over on a local Ray cluster vs ray.put/ray.get (ray extra)")
    r.add_argument("--small-batches", type=int, default=32, help="6 MiB batches per run (default 32)")
    r.add_argument("--large-batches", type=int, default=6, help="64 MiB batches per run (default 6)")
    r.add_argument("--reps", type=int, default=3, help="runs per case, medians reported (default 3)")
    r.add_argument("--dir", type=Path, help="work under this folder (default: a temp dir in /tmp), removed after")
    w = sub.add_parser(
        "persist",
        help="tensor batches leaving the arena for Lance vs file write + fdatasync, with 1, 2 and all encoders; "
        "flush p50/p90 into an empty vs a 1M-row topic",
    )
    w.add_argument("--arena-mib", type=int, default=256, help="the broker's arena (default 256 MiB)")
    w.add_argument("--stream-factor", type=int, default=4, help="the stream is this many times the arena (default 4)")
    w.add_argument(
        "--encoders", type=int, action="append", help="encoder threads of a run; repeat (default: 1, 2, all cores)"
    )
    w.add_argument("--table-mib", type=int, default=256, help="table of the encoding comparison (default 256 MiB)")
    w.add_argument("--flush-prefill", type=int, default=1_000_000, help="rows stored before the flush test; 0: skip")
    w.add_argument("--runs", type=int, default=3, help="runs, medians reported (default 3)")
    w.add_argument("--dir", type=Path, help="work under this folder (default: a temp dir in /tmp), removed after")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    return parser


@contextlib.contextmanager
def _work_dir(parent: Path | None, prefix: str) -> Iterator[Path]:
    """A fresh temp folder under ``parent`` (default /tmp), removed afterwards. Keep ``prefix`` short: the brokers'
    ipc socket paths live under it and a unix socket path has a limit of 107 bytes."""
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix=prefix, dir=parent or "/tmp"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _meta(
    args_list: list[str],
    revision: str,
    base: Path,
    *,
    packages: Sequence[str] = (),
    records: str | None = None,
    seed: int | None = None,
    broker: str | None = None,
) -> dict[str, Any]:
    """The run's description; ``packages``: more versions to name (where installed); ``broker``: the broker's
    arguments, ``{base}`` standing for the work dir."""
    meta: dict[str, Any] = {
        "command": shlex.join([sys.executable, "-m", "bench", *args_list]),
        "python": f"{platform.python_implementation()} {platform.python_version()} on {platform.platform()}",
        "cpus": os.cpu_count(),
        "packages": _versions(),
        "persisting revision": revision,
        "records": 'about 100 bytes: {"id": int, "text": 70 random ASCII chars, "score": float}',
        "work dir": str(base),
    }
    if packages:
        meta["packages"] += ", " + ", ".join(f"{n} {importlib.metadata.version(n)}" for n in packages if _installed(n))
    if records is not None:
        meta["records"] = records
    if seed is not None:
        meta["seed"] = seed
    if broker is not None:
        meta["persisting imported from"] = str(Path(persisting.__file__).parent)
        meta["broker"] = f"{sys.executable} -m broker " + broker.format(base=base)
    return meta


def _broker_main(args: argparse.Namespace, args_list: list[str], revision: str) -> int:
    if args.latency_n < 1 or args.warmup < 0 or args.records < 0 or args.pq_records < 0:
        raise SystemExit("--latency-n must be at least 1; --warmup, --records and --pq-records at least 0")
    if args.records % 200:
        raise SystemExit("--records must be a multiple of 200 (2 producers x put_batch of 100)")
    durabilities = tuple(dict.fromkeys(args.durability or ["sync", "process"])) if args.records else ()
    with _work_dir(args.dir, "pbb-") as base:
        result = run_broker_bench(
            base,
            latency_n=args.latency_n,
            warmup=args.warmup,
            records=args.records,
            durabilities=durabilities,
            pq_records=args.pq_records - args.pq_records % 2,
            pq_limit_s=args.pq_limit_s,
            seed=args.seed,
            progress=not args.no_progress,
        )
    result.meta = _meta(
        args_list, revision, base, broker="--storage-path {base}/storage --socket ipc://{base}/sock/b.sock"
    )
    print(render_broker(result, args.format))
    _plots(args.plot, plots.plot_broker, result)
    return 0


def _arena_main(args: argparse.Namespace, args_list: list[str], revision: str) -> int:
    counts = (args.small_batches, args.large_batches, args.paced_batches, args.beyond_batches)
    if any(n < 0 for n in counts) or args.arena_bytes < 1 or args.beyond_arena_bytes < 1:
        raise SystemExit("batch counts must be at least 0, arena sizes at least 1")
    if not 1 <= args.in_flight <= POOL:  # a source batch is stamped again only once its put has copied it
        raise SystemExit(f"--in-flight must be 1 to {POOL} (the producer's pool of source batches)")
    with _work_dir(args.dir, "pab-") as base:
        result = run_arena_bench(
            base,
            small_batches=args.small_batches,
            large_batches=args.large_batches,
            paced_batches=args.paced_batches,
            arena_bytes=args.arena_bytes,
            beyond_batches=args.beyond_batches,
            beyond_arena_bytes=args.beyond_arena_bytes,
            torch_ref=not args.no_torch,
            tq_ref=not args.no_transferqueue,
            seed=args.seed,
            progress=not args.no_progress,
            consumer_reads=args.consumer_reads,
            plot=args.plot is not None,
            in_flight=args.in_flight,
        )
    result.meta = _meta(
        args_list,
        revision,
        base,
        packages=("torch", "pyzmq", "transferqueue", "ray"),
        records="tensor batches: 256 x (int64[1024] + float32[4096]) (6 MiB) and 64 x float32[262144] (64 MiB)",
        seed=args.seed,
        broker="--storage-path {base}/<case>/storage --socket ipc://{base}/<case>/s/b.sock --arena-bytes N "
        "--log-level WARNING (one broker per persisting case)",
    )
    print(render_arena(result, args.format))
    _plots(args.plot, plots.plot_arena, result)
    return 0


def _samples_main(args: argparse.Namespace, args_list: list[str], revision: str) -> int:
    if args.puts < 1 or args.latency_n < 1 or args.warmup < 0 or args.get_timeout <= 0 or args.put_interval_ms < 0:
        raise SystemExit(
            "--puts and --latency-n must be at least 1, --warmup and --put-interval-ms at least 0, "
            "--get-timeout above 0"
        )
    with _work_dir(args.dir, "psb-") as base:
        result = run_samples_bench(
            base,
            puts=args.puts,
            put_interval_s=args.put_interval_ms / 1e3,
            latency_n=args.latency_n,
            warmup=args.warmup,
            get_timeout=args.get_timeout,
            seed=args.seed,
            progress=not args.no_progress,
        )
    result.meta = _meta(
        args_list,
        revision,
        base,
        packages=("pyzmq",),
        records='tensor batches {"x": float32[64, 16], "len": 64 ints}: 64 samples = 8 GRPO groups of n=8',
        seed=args.seed,
        broker="--storage-path {base}/storage --socket ipc://{base}/s/b.sock --log-level WARNING",
    )
    print(render_samples(result, args.format))
    _plots(args.plot, plots.plot_samples, result)
    return 0


def _persist_main(args: argparse.Namespace, args_list: list[str], revision: str) -> int:
    from bench.persist.workload import render_persist, run_persist_bench

    cores = len(os.sched_getaffinity(0))
    encoders = list(dict.fromkeys(args.encoders or [1, 2, cores]))
    if min(encoders) < 1 or args.runs < 1 or args.arena_mib < 1 or args.stream_factor < 1 or args.flush_prefill < 0:
        raise SystemExit("--encoders, --runs, --arena-mib and --stream-factor must be at least 1, --flush-prefill 0+")
    with _work_dir(args.dir, "pps-") as base:
        result = run_persist_bench(
            base,
            arena_mib=args.arena_mib,
            stream_factor=args.stream_factor,
            encoders=encoders,
            table_mib=args.table_mib,
            flush_prefill=args.flush_prefill,
            runs=args.runs,
            seed=args.seed,
            progress=not args.no_progress,
        )
    result.meta = _meta(
        args_list,
        revision,
        base,
        records=f"tensor batches {{'x': float32[16, 262144]}} (16 MiB); flush test: {_meta([], '', base)['records']}",
        seed=args.seed,
        broker="--storage-path {base}/stream-N/storage --socket ipc://{base}/stream-N/s/b.sock --arena-bytes A "
        "--log-level WARNING, with PERSISTING_LANCE_ENCODERS=N (one broker per run)",
    )
    print(render_persist(result))
    return 0


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# Benches that parse their own arguments: name -> module with ``main(argv) -> int``.
# Name -> one line of help, for ``python -m bench``'s list.
NAMES = {
    "queue": "persisting Queue vs persist-queue: write, read, flush cost",
    "broker": "put round trip vs raw ZeroMQ; 2x2 processes through the broker vs persist-queue SQLiteAckQueue",
    "arena": "tensor batches through the broker's shared memory vs memcpy and torch.multiprocessing.Queue",
    "samples": "get_meta (GRPOGroupNSampler) through the broker vs the protocol's hello round trip",
    "storage": "flush and read throughput: a topic on a local S3 server (moto) vs local disk",
    "jagged": "jagged int64 token batches through the broker vs padded and vs torch.multiprocessing.Queue",
    "ray": "cross-node tensor hand-over on a local Ray cluster vs ray.put/ray.get (ray extra)",
    "persist": "tensor batches leaving the arena for Lance vs file write + fdatasync; flush: empty vs full topic",
    "chaos": "kill -9 of producers, consumers and the broker, and fuzzed frames",
    "pq": "persist-queue's API: persist-queue beside persisting.compat.persistqueue",
    "imports": "a fresh process's import of persisting",
    "verl": "a verl-shaped step through persisting's TransferQueue layer vs TransferQueue",
    "verl-nodes": "the TransferQueue layer on two Ray nodes against one",
    "verl-dedup": "the TransferQueue layer's dedup on a GRPO step, on and off",
    "multimodal": "multimodal batches: a big batch, a stream into Lance, a GRPO step with dedup",
    "lance-encoding": "Lance encodings of tensor columns: write and read cost",
    "wal-rounds": "one group-commit round of the log beyond its fdatasync",
    "lance-read-cpu": "CPU seconds per GB of a read after the flush, broker and consumer",
    "lance-read-apis": "CPU seconds per GB of pylance's read APIs",
}

_STANDALONE = {
    "chaos": "bench.chaos",
    "pq": "bench.pq_bench",
    "imports": "bench.import_bench",
    "verl": "bench.verl_bench",
    "verl-nodes": "bench.verl_nodes",
    "verl-dedup": "bench.verl_dedup",
    "multimodal": "bench.multimodal",
    "lance-encoding": "bench.lance_encoding",
    "wal-rounds": "bench.wal_rounds",
    "lance-read-cpu": "bench.lance_read_cpu",
    "lance-read-apis": "bench.lance_read_apis",
}


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    if args_list[:1] and args_list[0] in _STANDALONE:
        module = importlib.import_module(_STANDALONE[args_list[0]])
        return int(module.main(args_list[1:]))
    args = _parser().parse_args(args_list)
    revision = _git_revision()  # before the run: the code measured is the code imported now
    if args.bench == "broker":
        return _broker_main(args, args_list, revision)
    if args.bench == "arena":
        return _arena_main(args, args_list, revision)
    if args.bench == "samples":
        return _samples_main(args, args_list, revision)
    if args.bench == "storage":
        from bench.object_store_bench import render_storage, run_storage_bench

        with _work_dir(args.dir, "pso-") as base:
            rows = run_storage_bench(
                base,
                n_small=args.records,
                n_tensor=args.tensors,
                tensor_kib=args.tensor_kib,
                reps=args.reps,
                seed=args.seed,
            )
        print(f"python -m bench {shlex.join(args_list)}  (persisting {revision}; {_versions()})")
        print(render_storage(rows))
        return 0
    if args.bench == "jagged":
        from bench.jagged_bench import lengths_of, render_jagged, run_jagged_bench

        with _work_dir(args.dir, "psj-") as base:
            rows = run_jagged_bench(base, args)
        tokens = int(lengths_of(args.samples, args.min_len, args.max_len, args.seed).sum())
        print(f"python -m bench {shlex.join(args_list)}  (persisting {revision}; {_versions()})")
        print(render_jagged(rows, args, tokens))
        return 0
    if args.bench == "persist":
        return _persist_main(args, args_list, revision)
    if args.bench == "ray":
        from bench.ray_bench import render_ray, run_ray_bench

        with _work_dir(args.dir, "psr-") as base:
            rows = run_ray_bench(
                base, batches={"6 MiB": args.small_batches, "64 MiB": args.large_batches}, reps=args.reps
            )
        print(f"python -m bench {shlex.join(args_list)}  (persisting {revision}; {_versions()})")
        print(render_ray(rows))
        return 0
    ns = args.n or [10_000]
    if any(n < 1 for n in ns):
        raise SystemExit("--n must be at least 1")
    with _work_dir(args.dir, "persisting-bench-") as base:
        result = run_queue_bench(
            ns,
            base,
            peer_limit_s=args.peer_limit_s,
            flush_prefill=args.flush_prefill,
            flush_reps=args.flush_reps,
            seed=args.seed,
            progress=not args.no_progress,
        )
    result.meta = _meta(args_list, revision, base)
    print(render(result, args.format))
    _plots(args.plot, plots.plot_queue, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
