"""k8s/: the committed manifests are exactly what k8s/render.py makes of values.json, every one is a valid
Kubernetes object, and they agree with docker-compose.yml and docker-compose.multinode.yml on what
they share (image, ports, /dev/shm, mount paths, secrets, nodes, run directory); every pod starts as the user."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from k8s import render  # the repository root is on pytest's pythonpath (pyproject.toml)

ROOT = Path(__file__).resolve().parents[2]
K8S_DIR = ROOT / "k8s"

KUBERNETES_VERSION = "1.30.0"
VALUES = render.load_values()
RENDERED = render.render(VALUES)
MANIFESTS = {path: json.loads(text) for path, text in RENDERED.items()}
DEPLOYMENT = MANIFESTS["dev/deployment.json"]
JOB = MANIFESTS["train/job.json"]
POD_SPECS = {"dev": DEPLOYMENT["spec"]["template"]["spec"], "train": JOB["spec"]["template"]["spec"]}
COMPOSE_SERVICE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["torchlab"]
MULTINODE = yaml.safe_load((ROOT / "docker-compose.multinode.yml").read_text())
BINARY_UNITS = {"": 0, "k": 1, "m": 2, "g": 3, "ki": 1, "mi": 2, "gi": 3}


def compose_default(value):
    """The value compose uses when no variable is set: the default of `${VAR:-default}`, or value itself."""
    interpolated = re.fullmatch(r"\$\{\w+:-([^}]*)\}", value)
    return interpolated.group(1) if interpolated else value


def size_in_bytes(size):
    """A size in Docker's (8g) or Kubernetes' binary (8Gi) notation, in bytes."""
    number, unit = re.fullmatch(r"(\d+)([kmg]i?)?b?", size.lower()).groups()
    return int(number) * 1024 ** BINARY_UNITS[unit or ""]


def main_container(pod_spec):
    (container,) = pod_spec["containers"]
    return container


def mounts_by_path(container):
    return {mount["mountPath"]: mount for mount in container["volumeMounts"]}


def volume(pod_spec, name):
    return next(volume for volume in pod_spec["volumes"] if volume["name"] == name)


def compose_mounts(service):
    """{container path: options} of a compose service's volumes."""
    mounts = {}
    for entry in service["volumes"]:
        path, options = re.fullmatch(r"(?:\$\{[^}]*\}|[^:]+):([^:]+):?(.*)", entry).groups()
        mounts[path] = options
    return mounts


def torchrun_flags(args):
    """{flag name: value} of torchrun's own flags, those before the script."""
    flags = {}
    for arg in args[1 : args.index("/opt/torchlab/train.py")]:
        name, _, value = arg.partition("=")
        flags[name] = value
    return flags


def test_committed_manifests_are_a_fresh_render():
    committed = {f"{directory}/{path.name}": path.read_text() for directory in render.OUTPUT_DIRS
                 for path in (K8S_DIR / directory).glob("*")}  # fmt: skip
    assert committed == RENDERED, "k8s/ differs from k8s/values.json: run `python3 k8s/render.py`"


def test_the_script_writes_the_same_bytes_whatever_the_hash_seed(tmp_path):
    for seed in ("1", "2"):
        copy = tmp_path / seed
        copy.mkdir()
        for name in ("render.py", "values.json"):
            shutil.copy(K8S_DIR / name, copy / name)
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, str(copy / "render.py")], env=env, capture_output=True, check=True)
        assert {path: (copy / path).read_text() for path in RENDERED} == RENDERED


@pytest.mark.parametrize("path", sorted(MANIFESTS))
def test_every_manifest_is_a_valid_kubernetes_object(path):
    kubernetes_validate.validate(MANIFESTS[path], KUBERNETES_VERSION, strict=True)


def test_compose_file_agrees_with_the_values():
    assert compose_default(COMPOSE_SERVICE["image"]) == VALUES["image"]
    container_ports = {int(port.rsplit(":", 1)[1]) for port in COMPOSE_SERVICE["ports"]}
    assert container_ports == {VALUES["ports"]["jupyter"], VALUES["ports"]["ssh"]}
    assert size_in_bytes(compose_default(COMPOSE_SERVICE["shm_size"])) == size_in_bytes(VALUES["shm_size"])
    mounts = compose_mounts(COMPOSE_SERVICE)
    assert set(mounts) == set(VALUES["mount_paths"].values())
    assert mounts[VALUES["mount_paths"]["data"]] == "ro"
    # Compose mounts each secret at /run/secrets/<name>: the same files as the Secret's in the pod.
    assert set(COMPOSE_SERVICE["secrets"]) == set(VALUES["secret"]["keys"])
    dev_env = {item["name"]: item["value"] for item in main_container(POD_SPECS["dev"])["env"]}
    assert COMPOSE_SERVICE["environment"] == dev_env


def test_multinode_compose_file_agrees_with_the_job():
    node = MULTINODE["services"]["node0"]
    compose_flags = torchrun_flags(node["command"].split())
    job_flags = torchrun_flags(main_container(POD_SPECS["train"])["args"])
    assert compose_flags["--nnodes"] == job_flags["--nnodes"] == str(VALUES["train"]["nodes"])
    assert compose_flags["--rdzv-endpoint"] == f"node0:{job_flags['--master-port']}"
    run_dir = f"{render.runs_path(VALUES)}/{VALUES['train']['run_name']}"
    assert f"--run-dir {run_dir} " in node["command"]
    assert set(compose_mounts(node)) == {VALUES["mount_paths"]["data"], render.runs_path(VALUES)}
    user = VALUES["user"]
    chown = ["chown", f"{user['uid']}:{user['gid']}", render.runs_path(VALUES)]
    assert MULTINODE["services"]["runs-owner"]["entrypoint"] == chown


@pytest.mark.parametrize("component", sorted(POD_SPECS))
def test_every_pod_starts_as_the_user_under_restricted_pod_security(component):
    pod_spec = POD_SPECS[component]
    user = VALUES["user"]
    pod_context = pod_spec["securityContext"]
    assert pod_context["runAsNonRoot"] is True
    assert (pod_context["runAsUser"], pod_context["runAsGroup"], pod_context["fsGroup"]) == (
        user["uid"],
        user["gid"],
        user["gid"],
    )
    assert pod_context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "initContainers" not in pod_spec  # nothing starts as root
    context = main_container(pod_spec)["securityContext"]
    assert context == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    # The volume types Pod Security "restricted" allows.
    allowed = {"persistentVolumeClaim", "secret", "emptyDir", "configMap", "projected", "downwardAPI"}
    for pod_volume in pod_spec["volumes"]:
        assert set(pod_volume) - {"name"} <= allowed


def test_secret_files_are_readable_by_the_users_group():
    secrets = volume(POD_SPECS["dev"], "secrets")["secret"]
    assert secrets["defaultMode"] == 0o440


@pytest.mark.parametrize("component", sorted(POD_SPECS))
def test_every_pod_has_data_read_only_shm_in_memory_and_gpus(component):
    pod_spec = POD_SPECS[component]
    container = main_container(pod_spec)
    mounts = mounts_by_path(container)
    data = mounts[VALUES["mount_paths"]["data"]]
    assert data["readOnly"]
    data_claim = volume(pod_spec, data["name"])["persistentVolumeClaim"]
    assert data_claim == {"claimName": VALUES["data_claim"], "readOnly": True}
    shm = volume(pod_spec, mounts["/dev/shm"]["name"])
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": VALUES["shm_size"]}
    assert container["resources"]["limits"]["nvidia.com/gpu"] > 0
    assert container["image"] == VALUES["image"]
    assert "command" not in container  # the image's entrypoint sets up the user, then runs args as that user


def test_dev_pod_takes_token_and_key_from_the_secret_and_keeps_its_state_on_claims():
    pod_spec = POD_SPECS["dev"]
    container = main_container(pod_spec)
    secret = VALUES["secret"]
    secret_mount = mounts_by_path(container)[secret["mount_path"]]
    assert secret_mount["readOnly"]
    secret_volume = volume(pod_spec, secret_mount["name"])["secret"]
    assert secret_volume["secretName"] == secret["name"]
    assert {item["key"]: item["path"] for item in secret_volume["items"]} == {key: key for key in secret["keys"]}
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env == {var: f"{secret['mount_path']}/{key}" for key, var in secret["keys"].items()}

    claims = {claim["metadata"]["name"] for claim in MANIFESTS.values() if claim["kind"] == "PersistentVolumeClaim"}
    mounts = mounts_by_path(container)
    for path in (VALUES["mount_paths"]["workspace"], VALUES["mount_paths"]["ssh_host_keys"]):
        assert volume(pod_spec, mounts[path]["name"])["persistentVolumeClaim"]["claimName"] in claims


def test_dev_pod_probes_and_service():
    container = main_container(POD_SPECS["dev"])
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"jupyter": VALUES["ports"]["jupyter"], "ssh": VALUES["ports"]["ssh"]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/api", "port": "jupyter"}
    assert container["livenessProbe"]["exec"]["command"] == ["/usr/local/bin/torchlab-healthcheck"]
    service = MANIFESTS["dev/service.json"]
    assert service["spec"]["selector"] == DEPLOYMENT["spec"]["template"]["metadata"]["labels"]
    assert {port["port"] for port in service["spec"]["ports"]} == set(ports.values())


def test_job_is_indexed_over_the_nodes_with_rendezvous_on_pod_0_of_its_headless_service():
    train = VALUES["train"]
    spec = JOB["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == train["nodes"]
    service = MANIFESTS["train/service.json"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == spec["template"]["metadata"]["labels"]
    assert spec["template"]["spec"]["subdomain"] == service["metadata"]["name"] == JOB["metadata"]["name"]
    flags = torchrun_flags(main_container(POD_SPECS["train"])["args"])
    assert flags["--nnodes"] == str(train["nodes"])
    assert flags["--node-rank"] == "$(JOB_COMPLETION_INDEX)"
    assert flags["--master-addr"] == f"{JOB['metadata']['name']}-0.{service['metadata']['name']}"
    assert flags["--master-port"] == str(VALUES["ports"]["rendezvous"])
    runs_mount = mounts_by_path(main_container(POD_SPECS["train"]))[render.runs_path(VALUES)]
    runs_claim = volume(POD_SPECS["train"], runs_mount["name"])["persistentVolumeClaim"]["claimName"]
    assert MANIFESTS["train/runs-claim.json"]["metadata"]["name"] == runs_claim
    assert MANIFESTS["train/runs-claim.json"]["spec"]["accessModes"] == ["ReadWriteMany"]
