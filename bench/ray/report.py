"""The table of ``python -m bench ray``: per batch size and path, GB/s of the get phase and of put + get, against
ray.put/ray.get of the same arrays in the same run."""

from __future__ import annotations

from bench.harness import Metric, Report, Table

from .workload import RAY, SHAPES, Times


def ray_report(times: dict[str, Times], batches: dict[str, int]) -> Report:
    table = Table(
        "Cross-node tensor hand-over on a local Ray cluster (a head + raylets A and B)",
        ("batch", "path"),
        (
            Metric("get GB/s"),
            Metric("put+get GB/s"),
            Metric("put s", higher_is_better=False, digits=4),
            Metric("get s", higher_is_better=False, digits=4),
        ),
        (RAY,),
        ("batches",),
        runs=True,
    )
    for label, cases in times.items():
        samples, width = SHAPES[label]
        nbytes = samples * width * 4 * batches[label]
        for case, runs in cases.items():
            row = table.add(
                label,
                case,
                group=label,
                get_GB_s=[nbytes / g / 1e9 for _, g in runs],
                put_get_GB_s=[nbytes / (p + g) / 1e9 for p, g in runs],
                put_s=[p for p, _ in runs],
                get_s=[g for _, g in runs],
            )
            row.cells["batches"] = str(batches[label])
    return Report("python -m bench ray: persisting.ray across two nodes vs ray.put/ray.get", [table])
