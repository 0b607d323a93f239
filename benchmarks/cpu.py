"""CPU-seconds of a process tree (user + system), for the benchmarks.

A :class:`TreeCpu` samples a root process and every descendant (the JVM, Spark's Python daemon and
workers) with psutil. Each process counts its own CPU plus that of the children it has waited
for; a process that ends between two samples keeps its last sample, so a poll every
``interval`` seconds loses at most that much of a short-lived process's end.
"""

from __future__ import annotations

import contextlib
import os
import threading

import psutil


class TreeCpu:
    """CPU-seconds used by ``root``'s tree since :meth:`start`, less the ``exclude`` trees."""

    def __init__(self, root: int | None = None, exclude: tuple[int, ...] = (), interval: float = 0.1) -> None:
        self._root = psutil.Process(root or os.getpid())
        self._exclude = set(exclude)
        self._interval = interval
        self._start: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._kinds: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _processes(self) -> list[psutil.Process]:
        excluded: set[int] = set()
        for pid in self._exclude:
            with contextlib.suppress(psutil.NoSuchProcess):
                excluded |= {pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))}
        tree = [self._root, *self._root.children(recursive=True)]
        return [p for p in tree if p.pid not in excluded]

    def _sample(self) -> dict[int, float]:
        seen = {}
        for p in self._processes():
            try:
                t = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            seen[p.pid] = t.user + t.system + t.children_user + t.children_system
            self._kinds[p.pid] = _kind(p)  # again each time: spark-submit's shell execs java
        return seen

    def _poll(self) -> None:
        while not self._stop.wait(self._interval):
            self._last.update(self._sample())

    def start(self) -> TreeCpu:
        self._start = self._sample()
        self._last = dict(self._start)
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> float:
        """CPU-seconds since :meth:`start`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._last.update(self._sample())
        return sum(self.by_kind().values())

    def by_kind(self) -> dict[str, float]:
        """CPU-seconds per kind of process (``jvm``, ``python worker``, ``python``, ...)."""
        kinds: dict[str, float] = {}
        for pid, v in self._last.items():
            kind = self._kinds.get(pid, "other")
            kinds[kind] = kinds.get(kind, 0.0) + v - self._start.get(pid, 0.0)
        return kinds


def _kind(process: psutil.Process) -> str:
    """``jvm``, ``spark python workers`` (below the JVM) or ``driver`` (the rest)."""
    try:
        if process.name() == "java":
            return "jvm"
        if any(parent.name() == "java" for parent in process.parents()):
            return "spark python workers"
    except psutil.Error:
        return "other"
    return "driver"
