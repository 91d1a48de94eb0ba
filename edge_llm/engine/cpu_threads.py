"""How many threads torch runs CPU ops on: no more than the CPUs this process may use.

torch sizes its pool from the machine's physical cores. In a container limited by an affinity
mask (``docker --cpuset-cpus``, ``taskset``) or a CPU quota (``docker --cpus``, Kubernetes
limits, Cloud Run) that counts the host's cores, and every parallel op then waits at a barrier
for threads the kernel has descheduled. A user's own choice wins: ``OMP_NUM_THREADS`` in the
environment, or a ``torch.set_num_threads`` below the available count, is kept as it is.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from edge_llm import envs

logger = logging.getLogger(__name__)

_CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" or "max ..."


def available_cpus(cpu_max: Path = _CGROUP_CPU_MAX) -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup v2 CPU quota
    (whole CPUs, at least one)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity call on this platform (macOS)
        cpus = os.cpu_count() or 1
    try:
        quota, period = cpu_max.read_text().split()[:2]
    except (OSError, ValueError):
        return cpus
    if quota == "max":
        return cpus
    return max(1, min(cpus, int(quota) // int(period)))


def set_cpu_threads() -> int:
    """Cap torch's CPU thread pool at ``available_cpus()`` unless ``OMP_NUM_THREADS`` is set;
    returns the thread count in use. Call once before the first CPU forward."""
    cpus = available_cpus()
    threads = torch.get_num_threads()
    user_set = envs.OMP_NUM_THREADS.is_set()  # the OpenMP runtime's own variable
    if not user_set and threads > cpus:
        torch.set_num_threads(cpus)
        threads = cpus
    logger.info("CPU: %d torch threads (%d CPUs available to this process%s)", threads, cpus,
                ", OMP_NUM_THREADS set" if user_set else "")
    return threads


@contextlib.contextmanager
def threads_at_most(n: int | None) -> Iterator[None]:
    """Within it, torch's CPU ops run on at most ``n`` threads (None: as set); the count
    before is restored after."""
    before = torch.get_num_threads()
    if n is None or n >= before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
