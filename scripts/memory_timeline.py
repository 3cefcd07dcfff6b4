#!/usr/bin/env python
"""Summarize a server's memory timeline written by ``scripts/memory_sampler``.

    python scripts/memory_timeline.py DIR [--json out.json]

Prints, in GB, the samples where the resident size, MLX's active memory and the heap's
bytes in use were largest, each with what the process held then: resident size, the
heap obtained from the system, in use and free, mmapped chunks, MLX's active and cache
bytes; and the first sample (before the model loaded) for reference. With several
timelines in DIR (several servers), each is summarized.
"""

import argparse
import glob
import json
import os

COLUMNS = ("seconds", "resident", "heap", "heap_in_use", "heap_free", "mmapped",
           "mlx_active", "mlx_cache")


def read(path):
    rows = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == len(COLUMNS):
                rows.append(dict(zip(COLUMNS, map(float, parts))))
    return rows


def summary(rows):
    gb = lambda r: {k: (round(v, 2) if k == "seconds" else round(v / 1e9, 3))
                    for k, v in r.items()}
    return {"samples": len(rows),
            "max_resident": gb(max(rows, key=lambda r: r["resident"])),
            "max_mlx_active": gb(max(rows, key=lambda r: r["mlx_active"])),
            "max_heap_in_use": gb(max(rows, key=lambda r: r["heap_in_use"]))}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder")
    p.add_argument("--json")
    args = p.parse_args(argv)
    paths = sorted(glob.glob(os.path.join(args.folder, "timeline-*.txt")))
    if not paths:
        raise SystemExit(f"memory_timeline: no timeline-*.txt in {args.folder}")
    out = {}
    for path in paths:
        rows = read(path)
        if not rows:
            continue
        out[os.path.basename(path)] = result = summary(rows)
        print(os.path.basename(path), f"({result['samples']} samples)")
        for key in ("max_resident", "max_mlx_active", "max_heap_in_use"):
            print(f"  {key}: {result[key]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
