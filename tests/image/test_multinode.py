"""docker-compose.multinode.yml with a real compose tool: one torchrun job over two containers
(2 nodes x 2 processes, gloo on the CPU). Both nodes take part and rank 0 checkpoints to the shared
volume; a node killed in the middle of the run ends the job with an error instead of a hang."""

import json
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from helpers.docker import IMAGE, Container, docker, wait_for

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = os.environ.get("COMPOSE", "docker-compose")
COMPOSE_FILE = ROOT / "docker-compose.multinode.yml"
NODES = ("node0", "node1")
PROCESSES_PER_NODE = 2  # the compose file's default NPROC_PER_NODE
RUN_DIR = "/workspace/runs/multinode"
# The user's flags with the sizes shrunk: a few steps of a small model on 2 CPU cores; 80 training images make
# 5 steps of 4 processes x 4 images in an epoch.
SAMPLE_DATA_SIZE = ("--per-class", "20", "--val-per-class", "2")
TINY_RUN = "--arch resnet18 --image-size 32 --batch-size 4 --workers 0"
# Generous: two containers start and import torch on a busy 2-core machine.
JOB_TIMEOUT_S = 300
# A dead node closes its connections: the others fail at their next collective, and torchrun ends the job.
FAILURE_TIMEOUT_S = 120

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which(COMPOSE) is None, reason=f"{COMPOSE} is not installed on this host"),
]


@pytest.fixture(scope="module")
def sample_data(tmp_path_factory):
    """The generated sample set, written once for the module, owned by this host's user."""
    out = tmp_path_factory.mktemp("multinode")
    docker(
        *["run", "--rm", "--user", f"{os.getuid()}:{os.getgid()}", "--entrypoint", "torchlab", "-v", f"{out}:/out"],
        *[IMAGE, "sample-data", "/out/data", *SAMPLE_DATA_SIZE],
        timeout=300,
    )
    return out / "data"


class MultinodeJob:
    """One compose project of docker-compose.multinode.yml: its own containers, network and runs volume."""

    def __init__(self, data, train_args):
        self.project = "torchlab-test-" + uuid.uuid4().hex[:8]
        self.env = {**os.environ, "TORCHLAB_IMAGE": IMAGE, "DATA": str(data), "SHM_SIZE": "1g"}
        self.env["TRAIN_ARGS"] = train_args

    def compose(self, *args, check=True):
        command = [COMPOSE, "-p", self.project, "-f", str(COMPOSE_FILE), *args]
        result = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=180, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip()}")
        return result.stdout

    def node(self, service):
        return Container(self.compose("ps", "-q", service).strip())

    def logs(self):
        return self.compose("logs", "--no-color", check=False)

    def in_run_dir(self, *command):
        """Run command in the shared run directory, through node0's volumes (also once node0 has exited)."""
        entrypoint, *args = command
        node0 = self.node("node0").name
        return docker("run", "--rm", "--volumes-from", node0, "-w", RUN_DIR, "--entrypoint", entrypoint, IMAGE, *args)


@pytest.fixture
def start_job(sample_data):
    """Starts jobs on the sample data with the given train.py flags; takes every one down, volumes too."""
    jobs = []

    def start(train_args):
        job = MultinodeJob(sample_data, train_args)
        jobs.append(job)
        job.compose("up", "-d")
        return job

    yield start
    for job in jobs:
        job.compose("down", "-v", "-t", "2", check=False)


def global_ranks(node):
    """The ranks torchrun gave this node's processes, from its log after the rendezvous."""
    found = re.search(r"global_ranks=\[([\d, ]*)\]", node.logs())
    return [int(rank) for rank in found.group(1).split(",")] if found else []


def test_two_nodes_train_one_job_and_rank_0_checkpoints_to_the_shared_volume(start_job):
    job = start_job(f"{TINY_RUN} --epochs 1 --max-steps 4 --log-interval 2")
    nodes = [job.node(service) for service in NODES]
    wait_for(lambda: not any(node.state()["Running"] for node in nodes), JOB_TIMEOUT_S, "both nodes to end", job.logs)
    assert [node.state()["ExitCode"] for node in nodes] == [0, 0], job.logs()

    ranks_by_node = [global_ranks(node) for node in nodes]
    assert all(len(ranks) == PROCESSES_PER_NODE for ranks in ranks_by_node), ranks_by_node
    assert sorted(sum(ranks_by_node, [])) == list(range(len(NODES) * PROCESSES_PER_NODE))
    config = json.loads(job.in_run_dir("cat", "config.json").stdout)
    assert config["world_size"] == len(NODES) * PROCESSES_PER_NODE
    assert f"stopped by --max-steps 4 at epoch 0, step 4: saved {RUN_DIR}/checkpoint-00000004.pt" in job.logs()
    files = job.in_run_dir("ls").stdout.split()
    events = [name for name in files if name.startswith("events.out.tfevents.")]
    assert len(events) == 1, files  # TensorBoard's, written by rank 0 alone
    # environment.json: rank 0's record of the environment, the only one
    expected = ["checkpoint-00000004.pt", "config.json", "environment.json", "metrics.jsonl"]
    assert sorted(set(files) - set(events)) == expected
    records = [json.loads(line) for line in job.in_run_dir("cat", "metrics.jsonl").stdout.splitlines()]
    assert [record["step"] for record in records if record["kind"] == "interval"] == [2, 4]


def test_a_node_killed_mid_run_ends_the_job_with_an_error(start_job):
    job = start_job(f"{TINY_RUN} --epochs 1000 --log-interval 1")
    node0, node1 = (job.node(service) for service in NODES)

    def training():
        if not node0.state()["Running"]:
            raise AssertionError(f"node0 ended before training:\n{job.logs()}")
        metrics = node0.exec("cat", f"{RUN_DIR}/metrics.jsonl", check=False).stdout
        return any(json.loads(line)["kind"] == "interval" for line in metrics.splitlines())

    wait_for(training, JOB_TIMEOUT_S, "the first training steps", job.logs)
    docker("kill", node1.name)
    killed = time.monotonic()
    wait_for(lambda: not node0.state()["Running"], FAILURE_TIMEOUT_S, "node0 to end after node1 died", job.logs)
    print(f"node0 ended {time.monotonic() - killed:.0f}s after node1 was killed")
    assert node0.state()["ExitCode"] != 0
    # torchrun's summary of the failed workers, after the gloo error that stopped them.
    assert "ChildFailedError" in node0.logs(), node0.logs()
