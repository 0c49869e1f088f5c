"""The machine's facts the loader plan takes: usable CPUs from the affinity and the cgroup quota (v1 and v2)."""

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
