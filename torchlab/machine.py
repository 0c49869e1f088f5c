"""What this machine gives a run, read from the kernel: the usable CPUs (affinity, capped by the cgroup quota),
/dev/shm and the memory free (capped by the cgroup limit). Machine is what the loader plan takes of it; probe()
reads it once."""

import dataclasses
import math
import os

CGROUP_ROOT = "/sys/fs/cgroup"
SHM_PATH = "/dev/shm"
MEMINFO_PATH = "/proc/meminfo"


def cgroup_cpu_limit(root=CGROUP_ROOT):
    """CPUs the cgroup CPU quota allows (e.g. 1.5 for docker run --cpus=1.5), or None without a quota."""
    try:  # cgroup v2: "QUOTA PERIOD" or "max PERIOD"
        with open(os.path.join(root, "cpu.max")) as cpu_max:
            quota, period = cpu_max.read().split()
        return None if quota == "max" else int(quota) / int(period)
    except FileNotFoundError:
        pass
    for controller in ("cpu", "cpu,cpuacct"):  # cgroup v1: a quota of -1 means none
        try:
            with open(os.path.join(root, controller, "cpu.cfs_quota_us")) as quota_file:
                quota = int(quota_file.read())
            with open(os.path.join(root, controller, "cpu.cfs_period_us")) as period_file:
                period = int(period_file.read())
        except FileNotFoundError:
            continue
        return None if quota <= 0 else quota / period
    return None


def usable_cpu_count(cgroup_root=CGROUP_ROOT):
    """CPUs this process may run on: its CPU affinity, capped by the cgroup quota (not os.cpu_count())."""
    cpus = len(os.sched_getaffinity(0))
    limit = cgroup_cpu_limit(cgroup_root)
    return cpus if limit is None else max(1, min(cpus, math.floor(limit)))


def shared_memory_bytes(path=SHM_PATH):
    """(size, free) of /dev/shm in bytes, or None where there is none."""
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize


def cgroup_memory_free(root=CGROUP_ROOT):
    """Bytes the cgroup memory limit leaves (its limit less its usage), or None without a limit."""
    for limit_name, usage_name in (
        ("memory.max", "memory.current"),  # cgroup v2: "max" for none
        ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),  # v1: a huge number for none
    ):
        try:
            with open(os.path.join(root, limit_name)) as limit_file:
                limit = limit_file.read().strip()
            with open(os.path.join(root, usage_name)) as usage_file:
                usage = int(usage_file.read())
        except FileNotFoundError:
            continue
        return None if limit == "max" else max(0, int(limit) - usage)
    return None


def memory_free(meminfo=MEMINFO_PATH, cgroup_root=CGROUP_ROOT):
    """Bytes a process can allocate now without swapping: the kernel's MemAvailable, capped by what the cgroup's
    limit leaves; None where neither can be read."""
    free = []
    try:
        with open(meminfo) as lines:
            free += [int(line.split()[1]) * 1024 for line in lines if line.startswith("MemAvailable:")]
    except FileNotFoundError:
        pass
    cgroup = cgroup_memory_free(cgroup_root)
    free += [] if cgroup is None else [cgroup]
    return min(free, default=None)


@dataclasses.dataclass(frozen=True)
class Machine:
    """What the loader plan takes of the machine: usable CPUs, /dev/shm's free bytes (None: no /dev/shm), the
    training processes sharing them (torchrun's processes on this node), whether they train on CUDA, and the
    memory free (None: unknown)."""

    cpus: int
    shm_free: int = None
    processes: int = 1
    cuda: bool = False
    memory_free: int = None


def probe(processes=1, cuda=False):
    """This machine, now, for `processes` training processes on it (on CUDA or not)."""
    shm = shared_memory_bytes()
    return Machine(usable_cpu_count(), None if shm is None else shm[1], processes, cuda, memory_free())
