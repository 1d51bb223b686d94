"""The benches not yet on the harness, run as before: two argparse subcommands and the benches that parse their
own arguments. Each entry leaves ``NAMES`` (and its code this file) when its suite moves to a folder of bench/
with a ``SUITE``; once ``NAMES`` is empty this file goes."""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
from pathlib import Path

from .meta import git_revision, versions
from .workdir import work_dir

# Name -> one line of help, for ``python -m bench``'s list.
NAMES = {
    "storage": "flush and read throughput: a topic on a local S3 server (moto) vs local disk",
    "ray": "cross-node tensor hand-over on a local Ray cluster vs ray.put/ray.get (ray extra)",
    "chaos": "kill -9 of producers, consumers and the broker, and fuzzed frames",
    "pq": "persist-queue's API: persist-queue beside persisting.compat.persistqueue",
    "verl": "a verl-shaped step through persisting's TransferQueue layer vs TransferQueue",
    "verl-nodes": "the TransferQueue layer on two Ray nodes against one",
    "verl-dedup": "the TransferQueue layer's dedup on a GRPO step, on and off",
    "multimodal": "multimodal batches: a big batch, a stream into Lance, a GRPO step with dedup",
    "lance-encoding": "Lance encodings of tensor columns: write and read cost",
    "wal-rounds": "one group-commit round of the log beyond its fdatasync",
    "lance-read-cpu": "CPU seconds per GB of a read after the flush, broker and consumer",
    "lance-read-apis": "CPU seconds per GB of pylance's read APIs",
}

# Benches that parse their own arguments: name -> module with ``main(argv) -> int``.
_STANDALONE = {
    "chaos": "bench.chaos",
    "pq": "bench.pq_bench",
    "verl": "bench.verl_bench",
    "verl-nodes": "bench.verl_nodes",
    "verl-dedup": "bench.verl_dedup",
    "multimodal": "bench.multimodal",
    "lance-encoding": "bench.lance_encoding",
    "wal-rounds": "bench.wal_rounds",
    "lance-read-cpu": "bench.lance_read_cpu",
    "lance-read-apis": "bench.lance_read_apis",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = parser.add_subparsers(dest="bench", required=True)
    o = sub.add_parser("storage", help=NAMES["storage"])
    o.add_argument("--records", type=int, default=100_000, help="small records per run (default 100000)")
    o.add_argument("--tensors", type=int, default=512, help="tensor records per run (default 512)")
    o.add_argument("--tensor-kib", type=int, default=256, help="KiB of float32 per tensor record (default 256)")
    o.add_argument("--reps", type=int, default=3, help="runs per store and workload, medians reported (default 3)")
    o.add_argument("--dir", type=Path, help="work under this folder (default: a temp dir in /tmp), removed after")
    o.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("ray", help=NAMES["ray"])
    r.add_argument("--small-batches", type=int, default=32, help="6 MiB batches per run (default 32)")
    r.add_argument("--large-batches", type=int, default=6, help="64 MiB batches per run (default 6)")
    r.add_argument("--reps", type=int, default=3, help="runs per case, medians reported (default 3)")
    r.add_argument("--dir", type=Path, help="work under this folder (default: a temp dir in /tmp), removed after")
    return parser


def main(argv: list[str]) -> int:
    if argv[0] in _STANDALONE:
        return int(importlib.import_module(_STANDALONE[argv[0]]).main(argv[1:]))
    args = _parser().parse_args(argv)
    revision = git_revision()
    head = f"python -m bench {shlex.join(argv)}  (persisting {revision}; {versions()})"
    if args.bench == "storage":
        from bench.object_store_bench import render_storage, run_storage_bench

        with work_dir(args.dir, "pso-") as base:
            rows = run_storage_bench(
                base,
                n_small=args.records,
                n_tensor=args.tensors,
                tensor_kib=args.tensor_kib,
                reps=args.reps,
                seed=args.seed,
            )
        print(head)
        print(render_storage(rows))
        return 0
    from bench.ray_bench import render_ray, run_ray_bench

    with work_dir(args.dir, "psr-") as base:
        rows = run_ray_bench(base, batches={"6 MiB": args.small_batches, "64 MiB": args.large_batches}, reps=args.reps)
    print(head)
    print(render_ray(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
