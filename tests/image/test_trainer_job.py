"""k8s/trainer/trainjob.json as Kubeflow Trainer runs it, emulated with Docker (no cluster runs here): one container
per node pod on a Docker network, each with its pod's hostname and DNS name, the environment the operator gives it
(helpers.kubeflow), the volumes of the TrainJob's runtime patch (its claim for the runs as one volume given to the
fsGroup, /data read-only, /dev/shm in memory), its user, groups and capabilities, and the manifest's own args
through the image's entrypoint, with sizes shrunk to fit 2 CPU cores. The job trains, a node is killed, the job
runs again (the pods' restartPolicy is OnFailure, JobSet's default: the kubelet restarts their containers in place)
and resumes from rank 0's checkpoint, in the one run directory."""

import json
import re
import uuid
from pathlib import Path

import pytest

from helpers import kubeflow
from helpers.docker import IMAGE, Container, docker, wait_for
from test_multinode import TINY_RUN, sample_data  # noqa: F401 (sample_data: a fixture)

ROOT = Path(__file__).resolve().parents[2]
TRAINJOB = json.loads((ROOT / "k8s/trainer/trainjob.json").read_text())
POD = kubeflow.node_pod_spec(TRAINJOB)
(NODE,) = POD["containers"]
RUN_DIR = NODE["args"][NODE["args"].index("--run-dir") + 1]
DATA = NODE["args"][NODE["args"].index("--data") + 1]
NODES = TRAINJOB["spec"]["trainer"]["numNodes"]
# After the manifest's flags, so that these win: 2 epochs of 10 steps (2 nodes x 1 process x 4 images, of 80) of a
# small model; rank 0 checkpoints every 1.2 s, so that the node is killed with most of the job still to run.
EPOCHS = 2
TINY_ARGS = [*TINY_RUN.split(), "--arch", "mobilenet_v3_small", "--epochs", str(EPOCHS), "--log-interval", "1"]
TINY_ARGS += ["--checkpoint-minutes", "0.02"]
# Generous: two containers start and import torch on a busy 2-core machine.
JOB_TIMEOUT_S = 240
FAILURE_TIMEOUT_S = 120

pytestmark = pytest.mark.slow


def docker_mounts(data):
    """docker run options for the node container's volumeMounts: the data claim is the sample data, the other claim
    (the runs) a new named volume, an in-memory emptyDir a tmpfs of its sizeLimit. Also {named volume: path}."""
    options, named = [], {}
    volumes = {volume["name"]: volume for volume in POD["volumes"]}
    for mount in NODE["volumeMounts"]:
        source, path = volumes[mount["name"]], mount["mountPath"]
        if "emptyDir" in source:
            assert source["emptyDir"]["medium"] == "Memory"
            size = re.fullmatch(r"(\d+[KMG])i", source["emptyDir"]["sizeLimit"]).group(1).lower()
            options += ["--tmpfs", f"{path}:size={size}"]
        elif path == DATA:
            assert mount["readOnly"] and source["persistentVolumeClaim"]["readOnly"]
            options += ["-v", f"{data}:{path}:ro"]
        else:
            volume = f"torchlab-test-{mount['name']}-{uuid.uuid4().hex[:8]}"
            named[volume] = path
            options += ["-v", f"{volume}:{path}"]
    return options, named


def security_options():
    """The pod's and the container's securityContext as docker run options; fsGroup is a supplementary group."""
    pod, container = POD["securityContext"], NODE["securityContext"]
    assert pod["runAsNonRoot"] and container["allowPrivilegeEscalation"] is False
    options = ["--user", f"{pod['runAsUser']}:{pod['runAsGroup']}", "--group-add", str(pod["fsGroup"])]
    return [
        *options,
        *(f"--cap-drop={cap}" for cap in container["capabilities"]["drop"]),
        "--security-opt=no-new-privileges",
    ]


class EmulatedTrainJob:
    """The TrainJob's node pods as containers, created once; start() runs (or reruns) every one of them."""

    def __init__(self, data):
        self.network = f"torchlab-test-{uuid.uuid4().hex[:8]}"
        docker("network", "create", self.network)
        mounts, self.volumes = docker_mounts(data)
        for volume in self.volumes:
            self.give_to_fs_group(volume)
        self.nodes = [self.create_node(rank, mounts) for rank in range(NODES)]

    def give_to_fs_group(self, volume):
        """What the kubelet does to a volume for fsGroup: its group owns it, with setgid, group-writable."""
        group = str(POD["securityContext"]["fsGroup"])
        script = f"chgrp {group} /volume && chmod 2775 /volume"
        docker("run", "--rm", "-v", f"{volume}:/volume", "--entrypoint", "sh", IMAGE, "-c", script)

    def create_node(self, rank, mounts):
        hostname, subdomain = kubeflow.node_hostname(TRAINJOB, rank)
        name = f"{self.network}-{hostname}"
        env = [arg for key, value in kubeflow.node_env(TRAINJOB, rank).items() for arg in ("-e", f"{key}={value}")]
        network = ["--network", self.network, "--hostname", hostname, "--network-alias", f"{hostname}.{subdomain}"]
        options = ["--name", name, "--label", "torchlab.test=1", *network, *env, *mounts, *security_options()]
        # The image under test in place of the manifest's (values.json's "image").
        docker("create", *options, IMAGE, *NODE["args"], *TINY_ARGS)
        return Container(name)

    def start(self):
        for node in self.nodes:
            docker("start", node.name)

    def logs(self):
        return "\n".join(f"--- {node.name}\n{node.logs()}" for node in self.nodes)

    def runs(self, *command):
        """command, run in the run directory on the job's volumes (as root: it only reads)."""
        entrypoint, *args = command
        volumes = [arg for volume, path in self.volumes.items() for arg in ("-v", f"{volume}:{path}")]
        return docker("run", "--rm", *volumes, "-w", RUN_DIR, "--entrypoint", entrypoint, IMAGE, *args).stdout

    def remove(self):
        for node in self.nodes:
            docker("rm", "-f", node.name, check=False)
        for volume in self.volumes:
            docker("volume", "rm", volume, check=False)
        docker("network", "rm", self.network, check=False)


@pytest.fixture
def trainjob(sample_data):  # noqa: F811 (the fixture imported above)
    job = EmulatedTrainJob(sample_data)
    yield job
    job.remove()


def checkpoints(listing):
    """The checkpoints in an `ls` of the run directory, oldest first."""
    return sorted(name for name in listing.split() if name.startswith("checkpoint-"))


def wait_ended(job, what, timeout):
    wait_for(lambda: not any(node.state()["Running"] for node in job.nodes), timeout, what, job.logs)
    return [node.state()["ExitCode"] for node in job.nodes]


def test_trainjob_trains_resumes_after_a_node_is_killed_and_keeps_one_run_directory(trainjob):
    node0, node1 = trainjob.nodes
    trainjob.start()

    def first_checkpoint():
        if not node0.state()["Running"]:
            raise AssertionError(f"node 0 ended before its first checkpoint:\n{trainjob.logs()}")
        return checkpoints(node0.exec("ls", RUN_DIR, check=False).stdout)

    wait_for(first_checkpoint, JOB_TIMEOUT_S, "rank 0's first checkpoint", trainjob.logs)
    docker("kill", node1.name)
    wait_for(lambda: not node0.state()["Running"], FAILURE_TIMEOUT_S, "node 0 to fail", trainjob.logs)
    assert node0.state()["ExitCode"] != 0, "the job ended before a node was killed: make its epochs longer"
    newest = checkpoints(trainjob.runs("ls"))[-1]

    trainjob.start()
    assert wait_ended(trainjob, "the rerun to end", JOB_TIMEOUT_S) == [0] * NODES, trainjob.logs()
    resumed = re.search(rf"resumed from {RUN_DIR}/{newest}: epoch \d+, step (\d+)", node0.logs())
    assert resumed, trainjob.logs()
    finished = re.search(rf"finished --epochs {EPOCHS} at step (\d+)", node0.logs())
    assert finished, trainjob.logs()
    assert trainjob.runs("ls", "..").split() == [Path(RUN_DIR).name]
    config = json.loads(trainjob.runs("cat", "config.json"))
    trainer = TRAINJOB["spec"]["trainer"]
    assert config["world_size"] == trainer["numNodes"] * trainer["numProcPerNode"]
    # The rerun's records go on from the checkpoint's step, after the first run's, in the same file.
    records = [json.loads(line) for line in trainjob.runs("cat", "metrics.jsonl").splitlines()]
    steps = [record["step"] for record in records if record["kind"] == "interval"]
    start, end = int(resumed.group(1)), int(finished.group(1))
    assert 0 < start < end and steps[:2] == [1, 2], steps
    assert steps[start - end :] == list(range(start + 1, end + 1)), steps
