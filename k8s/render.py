"""Render torchlab's Kubernetes manifests from values.json: `python k8s/render.py` (stdlib only).

k8s/dev/, the workstation as docker-compose.yml runs it: one pod (a Deployment of one replica) with Jupyter and
sshd, a ClusterIP Service for both ports, and claims for /workspace and the SSH host keys; the Jupyter token and
the SSH public key are files of a Secret. k8s/train/, one torchrun job over several pods as
docker-compose.multinode.yml runs it over two containers: an Indexed Job (pod i is torchrun's node i), the
headless Service that gives its pods DNS names (the store on pod 0), and a ReadWriteMany claim for the shared
run directory. Both read /data from an existing claim (values' data_claim), read-only, give /dev/shm an
in-memory emptyDir, and start as the image's user with no capability (Pod Security "restricted"): the entrypoint
then runs Jupyter and sshd as that user, and fsGroup gives each claim to its group.

k8s/trainer/ and k8s/notebook/ are the same two for teams that run Kubeflow: train.py as a Kubeflow Trainer
TrainJob on its torch-distributed runtime (the operator makes the pods, their DNS names and torchrun's PET_*
variables), and the workstation as a Kubeflow Notebook (the controller makes the pod, its Service and NB_PREFIX).

Each object is one JSON file (JSON is YAML; kubectl takes it), and the same values always give the same bytes:
edit values.json and rerun this, never the rendered files (tests/static/test_k8s.py compares them).
"""

import json
from pathlib import Path

K8S_DIR = Path(__file__).resolve().parent
VALUES_FILE = K8S_DIR / "values.json"
OUTPUT_DIRS = ("dev", "train", "trainer", "notebook")
# The torch-distributed runtime's replicated job and its container: runtimePatches name them.
TRAINER_NODE = "node"


def load_values(path=VALUES_FILE):
    return json.loads(Path(path).read_text())


def runs_path(values):
    """Where the shared run directories are mounted, as in docker-compose.multinode.yml."""
    return f"{values['mount_paths']['workspace']}/runs"


def object_metadata(values, name, component):
    return {"name": name, "labels": component_labels(values, component)}


def component_labels(values, component):
    return {"app.kubernetes.io/name": values["name"], "app.kubernetes.io/component": component}


def claim(values, name, component, access_mode, storage):
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": object_metadata(values, name, component),
        "spec": {"accessModes": [access_mode], "resources": {"requests": {"storage": storage}}},
    }


def claim_volume(name, claim_name, read_only=False):
    return {"name": name, "persistentVolumeClaim": {"claimName": claim_name, "readOnly": read_only}}


def shared_volumes(values):
    """/data (read-only) and /dev/shm, the same in every pod."""
    shm = {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": values["shm_size"]}}
    return [claim_volume("data", values["data_claim"], read_only=True), shm]


def shared_mounts(values):
    return [
        {"name": "data", "mountPath": values["mount_paths"]["data"], "readOnly": True},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]


def pod_security_context(values):
    """The pod starts as the image's user (runAsNonRoot); claims are made writable for its group. OnRootMismatch
    leaves files alone once a claim is the group's, so the SSH host keys it holds stay private (0600)."""
    user = values["user"]
    return {
        "runAsNonRoot": True,
        "runAsUser": user["uid"],
        "runAsGroup": user["gid"],
        "fsGroup": user["gid"],
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


CONTAINER_SECURITY_CONTEXT = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def gpu_limits(count):
    return {"limits": {"nvidia.com/gpu": count}} if count else {}


def torchlab_container(values, name, volume_mounts, **fields):
    """The image under its own entrypoint (tini, the user's passwd entry, host keys), as the user."""
    return {
        "name": name,
        "image": values["image"],
        "imagePullPolicy": "IfNotPresent",
        **fields,
        "securityContext": CONTAINER_SECURITY_CONTEXT,
        "volumeMounts": [*volume_mounts, *shared_mounts(values)],
    }


def dev_container(values):
    """The workstation's container: both ports, the workspace, host keys and secrets, probes on the services."""
    name, mounts, secret, dev = values["name"], values["mount_paths"], values["secret"], values["dev"]
    ports = [{"name": port, "containerPort": values["ports"][port]} for port in ("jupyter", "ssh")]
    return torchlab_container(
        values,
        name,
        [
            {"name": "workspace", "mountPath": mounts["workspace"]},
            {"name": "ssh-host-keys", "mountPath": mounts["ssh_host_keys"]},
            {"name": "secrets", "mountPath": secret["mount_path"], "readOnly": True},
        ],
        ports=ports,
        env=[{"name": var, "value": f"{secret['mount_path']}/{key}"} for key, var in secret["keys"].items()],
        resources=gpu_limits(dev["gpus"]),
        readinessProbe={"httpGet": {"path": "/api", "port": "jupyter"}, "periodSeconds": 10},
        # The image's HEALTHCHECK: both services answer (start period 60 s, every 15 s, 3 tries).
        livenessProbe={
            "exec": {"command": [values["healthcheck"]]},
            "initialDelaySeconds": 60,
            "periodSeconds": 15,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
    )


def dev_manifests(values):
    name, secret, dev = values["name"], values["secret"], values["dev"]
    workspace_claim, host_keys_claim = f"{name}-workspace", f"{name}-ssh-host-keys"
    secret_files = [{"key": key, "path": key} for key in secret["keys"]]
    pod_spec = {
        "securityContext": pod_security_context(values),
        "containers": [dev_container(values)],
        # Time for a train.py started over SSH to checkpoint (README: `docker stop -t 60`).
        "terminationGracePeriodSeconds": values["stop_grace_period_s"],
        "volumes": [
            claim_volume("workspace", workspace_claim),
            claim_volume("ssh-host-keys", host_keys_claim),
            {"name": "secrets", "secret": {"secretName": secret["name"], "items": secret_files, "defaultMode": 0o440}},
            *shared_volumes(values),
        ],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_metadata(values, name, "dev"),
        "spec": {
            "replicas": 1,
            # The claims are ReadWriteOnce: the old pod goes before the new one comes.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": component_labels(values, "dev")},
            "template": {"metadata": {"labels": component_labels(values, "dev")}, "spec": pod_spec},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_metadata(values, name, "dev"),
        "spec": {
            "selector": component_labels(values, "dev"),
            "ports": [{"name": port, "port": values["ports"][port], "targetPort": port} for port in ("jupyter", "ssh")],
        },
    }
    return {
        "dev/workspace-claim.json": claim(values, workspace_claim, "dev", "ReadWriteOnce", dev["workspace_storage"]),
        "dev/ssh-host-keys-claim.json": claim(
            values, host_keys_claim, "dev", "ReadWriteOnce", dev["ssh_host_keys_storage"]
        ),
        "dev/deployment.json": deployment,
        "dev/service.json": service,
    }


def torchrun_args(values):
    """The container's command, run by the entrypoint as the user. Static rendezvous: pod i is node i, and pod 0
    hosts the store whether or not its DNS name resolves yet (c10d would need it to, to know it is the host)."""
    train = values["train"]
    return [
        "torchrun",
        f"--nnodes={train['nodes']}",
        f"--nproc-per-node={train['processes_per_node']}",
        "--node-rank=$(JOB_COMPLETION_INDEX)",
        f"--master-addr={train['job']}-0.{train['job']}",
        f"--master-port={values['ports']['rendezvous']}",
        *train_script_args(values),
    ]


def train_script_args(values):
    """train.py and its flags, the same under any launcher."""
    train = values["train"]
    return [
        "/opt/torchlab/train.py",
        "--data",
        values["mount_paths"]["data"],
        "--run-dir",
        f"{runs_path(values)}/{train['run_name']}",
        *train["train_args"],
    ]


def train_manifests(values):
    train = values["train"]
    job_name, runs = train["job"], runs_claim(values)
    container = torchlab_container(
        values,
        "train",
        [{"name": "runs", "mountPath": runs_path(values)}],
        args=torchrun_args(values),
        ports=[{"name": "rendezvous", "containerPort": values["ports"]["rendezvous"]}],
        resources=gpu_limits(train["gpus_per_node"]),
    )
    pod_spec = {
        # Pod i is <job>-i.<job>: the headless Service of the same name gives it that DNS name.
        "subdomain": job_name,
        "restartPolicy": "Never",
        "securityContext": pod_security_context(values),
        "containers": [container],
        "terminationGracePeriodSeconds": values["stop_grace_period_s"],
        "volumes": [claim_volume("runs", runs["metadata"]["name"]), *shared_volumes(values)],
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": object_metadata(values, job_name, "train"),
        "spec": {
            "completionMode": "Indexed",
            "completions": train["nodes"],
            "parallelism": train["nodes"],
            # A failed pod fails the job: torchrun has no spare nodes to continue with.
            "backoffLimit": 0,
            "template": {"metadata": {"labels": component_labels(values, "train")}, "spec": pod_spec},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_metadata(values, job_name, "train"),
        "spec": {
            "clusterIP": "None",
            # Pod 0's name resolves as soon as it runs, before any readiness.
            "publishNotReadyAddresses": True,
            "selector": component_labels(values, "train"),
            "ports": [{"name": "rendezvous", "port": values["ports"]["rendezvous"], "targetPort": "rendezvous"}],
        },
    }
    return {
        "train/runs-claim.json": runs,
        "train/service.json": service,
        "train/job.json": job,
    }


def runs_claim(values):
    """The ReadWriteMany claim every node of a training job mounts at runs_path."""
    return claim(values, f"{values['name']}-runs", "train", "ReadWriteMany", values["train"]["runs_storage"])


def trainer_node_patch(values):
    """What the TrainJob adds to the runtime's node pods (runtimePatches, merged by name): the claims, /dev/shm, the
    user. The runtime leaves the container's command alone, so the image's entrypoint runs trainer.args."""
    return {
        "securityContext": pod_security_context(values),
        "terminationGracePeriodSeconds": values["stop_grace_period_s"],
        "volumes": [claim_volume("runs", runs_claim(values)["metadata"]["name"]), *shared_volumes(values)],
        "containers": [
            {
                "name": TRAINER_NODE,
                "securityContext": CONTAINER_SECURITY_CONTEXT,
                "volumeMounts": [{"name": "runs", "mountPath": runs_path(values)}, *shared_mounts(values)],
            }
        ],
    }


def trainjob_manifests(values):
    """A TrainJob on the ClusterTrainingRuntime torch-distributed. Its torch plugin sets PET_NNODES,
    PET_NPROC_PER_NODE (numProcPerNode), PET_NODE_RANK and PET_MASTER_ADDR/PORT (node 0's pod): plain `torchrun`
    reads them, so the args name no node, rank or address."""
    train, kubeflow = values["train"], values["kubeflow"]
    node_job = {"name": TRAINER_NODE, "template": {"spec": {"template": {"spec": trainer_node_patch(values)}}}}
    trainjob = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": object_metadata(values, train["job"], "train"),
        "spec": {
            "runtimeRef": {
                "apiGroup": "trainer.kubeflow.org",
                "kind": "ClusterTrainingRuntime",
                "name": kubeflow["training_runtime"],
            },
            "trainer": {
                "image": values["image"],
                "args": ["torchrun", *train_script_args(values)],
                "numNodes": train["nodes"],
                # One process per GPU, as --nproc-per-node=gpu; the operator's default ("auto") would start one
                # per CPU core on a node without GPUs.
                "numProcPerNode": train["gpus_per_node"],
                "resourcesPerNode": gpu_limits(train["gpus_per_node"]),
            },
            "runtimePatches": [
                {
                    "manager": kubeflow["patch_manager"],
                    "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [node_job]}}},
                }
            ],
        },
    }
    return {"trainer/runs-claim.json": runs_claim(values), "trainer/trainjob.json": trainjob}


def notebook_manifests(values):
    """A Kubeflow Notebook: the controller makes its StatefulSet and Service, adds port 8888 and sets NB_PREFIX
    (/notebook/<namespace>/<name>; a value given here would win, so none is). The user's files live in the
    home folder, on an empty claim named as the dashboard names the one it makes for a new notebook."""
    notebook = values["kubeflow"]["notebook"]
    home_claim = f"{notebook['name']}-workspace"
    container = torchlab_container(
        values,
        notebook["name"],
        [{"name": "home", "mountPath": notebook["home"]}],
        # The platform authenticates every request at its gateway (Istio and the dashboard's login) before it
        # reaches the pod: Jupyter runs without its own token, on purpose.
        env=[{"name": "JUPYTER_NO_AUTH", "value": "yes"}],
        resources=gpu_limits(notebook["gpus"]),
    )
    pod_spec = {
        "securityContext": pod_security_context(values),
        "containers": [container],
        "terminationGracePeriodSeconds": values["stop_grace_period_s"],
        "volumes": [claim_volume("home", home_claim), *shared_volumes(values)],
    }
    resource = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "Notebook",
        "metadata": object_metadata(values, notebook["name"], "notebook"),
        "spec": {"template": {"spec": pod_spec}},
    }
    home = claim(values, home_claim, "notebook", "ReadWriteOnce", notebook["home_storage"])
    return {"notebook/home-claim.json": home, "notebook/notebook.json": resource}


def render(values):
    """{path relative to k8s/: manifest text}."""
    manifests = {
        **dev_manifests(values),
        **train_manifests(values),
        **trainjob_manifests(values),
        **notebook_manifests(values),
    }
    return {path: json.dumps(manifest, indent=2) + "\n" for path, manifest in manifests.items()}


def main():
    rendered = render(load_values())
    for directory in OUTPUT_DIRS:
        for stale in (K8S_DIR / directory).glob("*.json"):
            if f"{directory}/{stale.name}" not in rendered:
                stale.unlink()
    for path, text in rendered.items():
        (K8S_DIR / path).parent.mkdir(exist_ok=True)
        (K8S_DIR / path).write_text(text)
        print(f"wrote k8s/{path}")


if __name__ == "__main__":
    main()
