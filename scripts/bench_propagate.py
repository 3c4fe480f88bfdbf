"""Benchmark: attention-weighted aggregation on the CPU, the head-block product vs the others.

``refimpl.ops.propagate`` computes ``out[v] = sum_{(u, v)} w_uv h[u]`` per head. The
candidates, forward and backward:

- block: what the library runs, one CSR product with all heads' ``A_h`` in one
  ``(N H, N H)`` block matrix (``A_h^T`` in the backward), ``d_w`` by one
  matrix-vector product over the channels;
- per head: a ``scipy.sparse`` CSR matrix and product per head (the previous choice);
- literal: what other backends run, gather the source rows per edge, scale, and
  ``segment_sum`` into targets (the ``(E, H, C)`` messages materialised), ``d_w`` by
  ``einsum``.

All are timed in one run on the same Cora-sized graph (N = 2708, E = 13264 with
self-loops), after checking that they agree. Prints median milliseconds and each
candidate's time over the block product's::

    python scripts/bench_propagate.py [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import scipy.sparse as sp

from refimpl import Graph
from refimpl.kernels.segment import gather, segment_sum
from refimpl.ops.propagate import propagate, propagate_backward

SHAPES = [(8, 8), (1, 64), (8, 64)]  # (H, C)


def median_ms(function: Callable[[], object], repeats: int = 30) -> float:
    function()  # warm caches (the CSR structures are built once per graph)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def per_head_matrices(w: np.ndarray, rows: object, columns: object) -> list:
    """One CSR ``(N, N)`` per head, entry ``w[e, h]`` at ``(rows.index[e], columns.index[e])``."""
    order, column, indptr = rows.pair_structure(columns)
    shape = (rows.num_segments, columns.num_segments)
    return [sp.csr_matrix((w[order, k], column, indptr), shape=shape) for k in range(w.shape[1])]


def per_head_forward(h: np.ndarray, w: np.ndarray, src: object, dst: object) -> np.ndarray:
    matrices = per_head_matrices(w, dst, src)  # A_h
    return np.stack([a @ h[:, k] for k, a in enumerate(matrices)], axis=1)


def per_head_backward(
    h: np.ndarray, w: np.ndarray, d_out: np.ndarray, src: object, dst: object
) -> tuple[np.ndarray, np.ndarray]:
    d_w = np.einsum("ehc,ehc->eh", gather(d_out, dst), gather(h, src))
    matrices = per_head_matrices(w, src, dst)  # A_h^T
    return np.stack([a @ d_out[:, k] for k, a in enumerate(matrices)], axis=1), d_w


def literal_forward(h: np.ndarray, w: np.ndarray, src: object, dst: object) -> np.ndarray:
    return segment_sum(gather(h, src) * w[..., None], dst)  # (E, H, C) messages, then (N, H, C)


def literal_backward(
    h: np.ndarray, w: np.ndarray, d_out: np.ndarray, src: object, dst: object
) -> tuple[np.ndarray, np.ndarray]:
    d_messages = gather(d_out, dst)  # (E, H, C)
    d_w = np.einsum("ehc,ehc->eh", d_messages, gather(h, src))
    return segment_sum(d_messages * w[..., None], src), d_w


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    num_nodes = 2708
    edges = rng.integers(0, num_nodes, size=(2, 10556))
    graph = Graph(edges, num_nodes).remove_self_loops().add_self_loops()
    src, dst = graph.src_segments(np), graph.dst_segments(np)
    rows = []
    print(f"{'H x C':>7} {'pass':<9} {'block ms':>9} {'per head':>9} {'literal':>8}")
    for heads, channels in SHAPES:
        h = rng.standard_normal((num_nodes, heads, channels)).astype(np.float32)
        w = rng.random((graph.num_edges, heads)).astype(np.float32)
        d_out = rng.standard_normal((num_nodes, heads, channels)).astype(np.float32)
        arguments = {"forward": (h, w, src, dst), "backward": (h, w, d_out, src, dst)}
        candidates = {
            "forward": (propagate, per_head_forward, literal_forward),
            "backward": (propagate_backward, per_head_backward, literal_backward),
        }
        for name, functions in candidates.items():
            outputs = [f(*arguments[name]) for f in functions]
            outputs = [out if isinstance(out, tuple) else (out,) for out in outputs]
            for other in outputs[1:]:  # the same values, to float32 rounding
                for got, want in zip(outputs[0], other, strict=True):
                    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            block, per_head, literal = (median_ms(partial(f, *arguments[name])) for f in functions)
            rows.append(
                {
                    "heads": heads,
                    "channels": channels,
                    "pass": name,
                    "block_ms": block,
                    "per_head_ms": per_head,
                    "literal_ms": literal,
                }
            )
            print(
                f"{f'{heads} x {channels}':>7} {name:<9} {block:>9.3f} "
                f"{per_head / block:>8.1f}x {literal / block:>7.1f}x"
            )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=2)


if __name__ == "__main__":
    main()
