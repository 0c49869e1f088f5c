"""The machine's facts the loader plan takes: usable CPUs from the affinity and the cgroup quota (v1 and v2), and
the memory free, capped by the cgroup limit."""

import os

import pytest

from torchlab import machine


def write_cgroup_files(root, files):
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


@pytest.mark.parametrize(
    ("files", "limit"),
    [
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({"cpu,cpuacct/cpu.cfs_quota_us": "300000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, 3.0),
        ({}, None),
    ],
)
def test_cgroup_cpu_limit_reads_v1_and_v2(tmp_path, files, limit):
    write_cgroup_files(tmp_path, files)
    assert machine.cgroup_cpu_limit(str(tmp_path)) == limit


def test_usable_cpus_count_affinity_and_quota_not_cpu_count(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    write_cgroup_files(tmp_path, {"cpu.max": "50000 100000\n"})
    assert machine.usable_cpu_count(str(tmp_path)) == 1
    write_cgroup_files(tmp_path, {"cpu.max": f"{(affinity + 4) * 100000} 100000\n"})
    assert machine.usable_cpu_count(str(tmp_path)) == affinity


AVAILABLE = 3000 * 1024  # the MemAvailable below


@pytest.mark.parametrize(
    ("files", "cgroup_free"),
    [
        ({"memory.max": "max\n", "memory.current": "100\n"}, None),
        ({"memory.max": "1000000\n", "memory.current": "400000\n"}, 600000),
        (
            {"memory/memory.limit_in_bytes": "9223372036854771712\n", "memory/memory.usage_in_bytes": "5\n"},
            2**63 - 4101,
        ),
        ({"memory/memory.limit_in_bytes": "2000000\n", "memory/memory.usage_in_bytes": "500000\n"}, 1500000),
        ({"memory.max": "1000\n", "memory.current": "4000\n"}, 0),
        ({}, None),
    ],
)
def test_memory_free_is_memavailable_capped_by_what_the_cgroup_limit_leaves(tmp_path, files, cgroup_free):
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    write_cgroup_files(cgroup, files)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal:        8000 kB\nMemFree:         1000 kB\nMemAvailable:    {AVAILABLE // 1024} kB\n")
    assert machine.cgroup_memory_free(str(cgroup)) == cgroup_free
    assert machine.memory_free(str(meminfo), str(cgroup)) == (
        AVAILABLE if cgroup_free is None else min(AVAILABLE, cgroup_free)
    )
    assert machine.memory_free(str(tmp_path / "no-meminfo"), str(cgroup)) == cgroup_free


def test_this_machine_has_memory_free():
    free = machine.probe().memory_free
    assert free is not None and 0 < free <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
