"""What Kubeflow Trainer makes of k8s/trainer/trainjob.json, read from its source (kubeflow/trainer v2.3.0) and
JobSet's, for the tests that check and emulate it without a cluster: the node pods' spec and environment; and the
notebook controller's idle-culling rules (culler_last_activity), run against /api/kernels."""

import copy
import datetime

from k8s import render

TRAINER_PORT = 29500  # pkg/constants: ContainerTrainerPort, the port PET_MASTER_PORT names


def node_patch(trainjob):
    """The pod spec that the TrainJob's runtimePatches give the runtime's node pods."""
    (patch,) = trainjob["spec"]["runtimePatches"]
    (node_job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert node_job["name"] == render.TRAINER_NODE, node_job["name"]
    return node_job["template"]["spec"]["template"]["spec"]


def node_pod_spec(trainjob):
    """A node pod's spec: the patch, with spec.trainer's image, args and resourcesPerNode in the node container
    (the runtime's own container gives only its name and an image that trainer.image replaces)."""
    pod_spec = copy.deepcopy(node_patch(trainjob))
    (container,) = pod_spec["containers"]
    trainer = trainjob["spec"]["trainer"]
    container.update(image=trainer["image"], args=trainer["args"], resources=trainer["resourcesPerNode"])
    return pod_spec


def node_hostname(trainjob, node_rank):
    """JobSet names node i's Job <trainjob>-node-0 and the Indexed Job its pod <job>-i, with the TrainJob's name as
    the pod's subdomain (the headless Service)."""
    name = trainjob["metadata"]["name"]
    return f"{name}-{render.TRAINER_NODE}-0-{node_rank}", name


def node_env(trainjob, node_rank):
    """The variables a node's container gets: spec.trainer.env, the torch plugin's PET_* (torch.go, EnforceMLPolicy:
    PET_NODE_RANK from the Job's completion index, the master at node 0's pod), and the Indexed Job's own
    JOB_COMPLETION_INDEX."""
    trainer = trainjob["spec"]["trainer"]
    env = {item["name"]: item["value"] for item in trainer.get("env", [])}
    master_host, subdomain = node_hostname(trainjob, 0)
    env.update(
        PET_NNODES=str(trainer["numNodes"]),
        PET_NPROC_PER_NODE=str(trainer["numProcPerNode"]),
        PET_NODE_RANK=str(node_rank),
        PET_MASTER_ADDR=f"{master_host}.{subdomain}",
        PET_MASTER_PORT=str(TRAINER_PORT),
        JOB_COMPLETION_INDEX=str(node_rank),
    )
    return env


def culler_last_activity(kernels, annotation, now):
    """Kubeflow's notebook culler, one check (kubeflow/kubeflow components/notebook-controller/controllers/
    culling_controller.go, updateNotebookLastActivityAnnotation; Open Data Hub runs the same): the notebook's
    last-activity annotation after it GETs /api/kernels. `kernels` is the decoded list (None: the GET failed).
    No kernels: not updated. A kernel whose execution_state is not "idle": now. Else the newest last_activity."""
    if not kernels:
        return annotation
    if any(kernel["execution_state"] != "idle" for kernel in kernels):
        return now
    return max(parse_time(kernel["last_activity"]) for kernel in kernels)


def culler_stops(annotation, now, cull_idle_minutes):
    """notebookIsIdle: the culler stops the notebook once CULL_IDLE_TIME minutes have passed since last-activity."""
    return now > annotation + datetime.timedelta(minutes=cull_idle_minutes)


def parse_time(text):
    """An RFC 3339 time as jupyter_server writes it (2026-12-07T03:25:47.668222Z), as Go's time.Parse reads it."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
