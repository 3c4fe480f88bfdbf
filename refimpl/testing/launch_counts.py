"""Counting what a block would cost on a device: kernel launches, syncs and host copies.

The strict stand-in (:mod:`refimpl.testing.strict`) runs the CuPy code path on NumPy;
inside ``with count_launches() as counts:`` it records each operation that would be a
kernel launch, a device-to-host synchronisation or a host-to-device copy under CuPy
(:class:`LaunchCounts` lists which), with the file and line that asked for it, so a test
can hold a training step to a budget and a failing one says where the operations went.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["OPEN_BLOCKS", "LaunchCounts", "count_launches", "record"]

_KINDS = ("launches", "syncs", "copies")


@dataclass
class LaunchCounts:
    """What a block run on the strict backend would cost on a device (:func:`count_launches`).

    ``launches``, the array operations that are kernel launches under CuPy: every ufunc call
    (operators included, in place or not, and ``ufunc.at`` / ``reduce`` / ...); every
    namespace function or array method whose result is a new array (``xp.zeros``,
    ``xp.where``, ``x.sum()``, ``x.astype`` to another dtype, ``x.copy()``, ``x.fill``);
    indexing with an array (a gather); every assignment into an array (``x[k] = v``); a cast
    in ``asarray``; and one per :func:`run_kernel`. Free: views (``reshape``, ``transpose``,
    basic slicing, ``broadcast_to``: any result sharing its input's memory), ``empty`` and
    ``empty_like`` (an allocation), and results that are no array (``xp.result_type``).

    ``syncs``, device-to-host reads, each a synchronisation point: ``float()``, ``int()``,
    ``bool()``, ``__index__``, ``.item()``, ``.tolist()``, ``format``, ``asnumpy``,
    ``.get()``; and operations whose output size depends on the data, which CuPy reads back
    before allocating (each also a launch): indexing or assigning with a boolean array,
    ``nonzero``, ``flatnonzero``, ``argwhere``, ``unique``.

    ``copies``, host-to-device copies: ``asarray`` / ``array`` of host data, a Python scalar
    or list included (an operator's scalar operand is a kernel argument: free).

    ``sites`` counts each kind by call site, ``(kind, "path:line")``: the first frame outside
    the stand-in and :mod:`refimpl.backend`, its path relative to the repository (with
    ``depth`` > 1, that many frames from there outwards, joined by ``" < "``).
    """

    launches: int = 0
    syncs: int = 0
    copies: int = 0
    sites: Counter = field(default_factory=Counter)
    depth: int = 1  # frames per site (count_launches)

    def hot_spots(self, kind: str = "launches", top: int = 20) -> list[tuple[str, int]]:
        """The ``top`` call sites with the most ``kind`` (``"launches"``, ``"syncs"`` or
        ``"copies"``), most first."""
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {', '.join(_KINDS)}, got {kind!r}")
        ranked = [(site, count) for (k, site), count in self.sites.items() if k == kind]
        return sorted(ranked, key=lambda item: (-item[1], item[0]))[:top]

    def report(self, top: int = 20) -> str:
        """The totals, then the ``top`` call sites of each kind."""
        lines = [f"{self.launches} launches, {self.syncs} syncs, {self.copies} copies"]
        for kind in _KINDS:
            lines += [f"  {kind} {count:4d}  {site}" for site, count in self.hot_spots(kind, top)]
        return "\n".join(lines)


OPEN_BLOCKS: list[LaunchCounts] = []  # the open count_launches blocks, outermost first
# frames skipped when naming a call site: the stand-in, this counter and the backend switch
_SKIPPED = tuple(
    os.path.join("refimpl", *parts)
    for parts in (("testing", "strict.py"), ("testing", "launch_counts.py"), ("backend.py",))
)
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@contextlib.contextmanager
def count_launches(depth: int = 1) -> Iterator[LaunchCounts]:
    """Count the launches, syncs and host-to-device copies of the block
    (:class:`LaunchCounts`): ``with count_launches() as counts: ...``. Blocks nest: each
    counts everything inside it. ``depth``: how many frames name a site, innermost first
    (``"validation.py:88 < optim.py:320"`` with 2: a shared helper told apart by caller)."""
    if type(depth) is not int or depth < 1:
        raise ValueError(f"count_launches depth must be a positive int, got {depth!r}")
    counts = LaunchCounts(depth=depth)
    OPEN_BLOCKS.append(counts)
    try:
        yield counts
    finally:
        OPEN_BLOCKS.remove(counts)


def record(kind: str) -> None:
    """One ``kind`` for every open :func:`count_launches` block, at the caller's site."""
    if not OPEN_BLOCKS:
        return
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.endswith(_SKIPPED):
        frame = frame.f_back
    frames = []  # (path, line), innermost first, as deep as the deepest open block asks
    while frame is not None and len(frames) < max(counts.depth for counts in OPEN_BLOCKS):
        path = os.path.abspath(frame.f_code.co_filename)
        path = os.path.relpath(path, _ROOT) if path.startswith(_ROOT + os.sep) else path
        frames.append(f"{path}:{frame.f_lineno}")
        frame = frame.f_back
    for counts in OPEN_BLOCKS:
        setattr(counts, kind, getattr(counts, kind) + 1)
        counts.sites[kind, " < ".join(frames[: counts.depth]) or "?"] += 1
