"""k8s/: the committed manifests are exactly what k8s/render.py makes of values.json, every one is a valid
Kubernetes object (Kubeflow's TrainJob and Notebook: valid against their CRDs' schemas, copied into crds/), and
they agree with docker-compose.yml and docker-compose.multinode.yml on what they share (image, ports, /dev/shm,
mount paths, secrets, nodes, run directory); every pod starts as the user."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from helpers import kubeflow
from k8s import render  # the repository root is on pytest's pythonpath (pyproject.toml)

ROOT = Path(__file__).resolve().parents[2]
K8S_DIR = ROOT / "k8s"

KUBERNETES_VERSION = "1.30.0"
VALUES = render.load_values()
RENDERED = render.render(VALUES)
MANIFESTS = {path: json.loads(text) for path, text in RENDERED.items()}
DEPLOYMENT = MANIFESTS["dev/deployment.json"]
JOB = MANIFESTS["train/job.json"]
TRAINJOB = MANIFESTS["trainer/trainjob.json"]
NOTEBOOK = MANIFESTS["notebook/notebook.json"]
POD_SPECS = {
    "dev": DEPLOYMENT["spec"]["template"]["spec"],
    "train": JOB["spec"]["template"]["spec"],
    "trainjob": kubeflow.node_pod_spec(TRAINJOB),
    "notebook": NOTEBOOK["spec"]["template"]["spec"],
}
CRD_FILES = sorted((Path(__file__).parent / "crds").glob("*.yaml"))
CRD_SCHEMAS = {
    (crd["apiVersion"], crd["kind"]): crd["openAPIV3Schema"]
    for crd in map(yaml.safe_load, map(Path.read_text, CRD_FILES))
}
CUSTOM = sorted(
    path for path, manifest in MANIFESTS.items() if (manifest["apiVersion"], manifest["kind"]) in CRD_SCHEMAS
)
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


def closed(schema):
    """schema, with every object that lists its properties closed to others, as kubernetes_validate's strict mode
    does for built-in kinds: the API server would drop a misspelt field of a custom resource without a word."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: closed(value) for key, value in schema.items()}
    open_ended = "additionalProperties" in schema or schema.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in schema and not open_ended:
        result["additionalProperties"] = False
    return result


CRD_VALIDATORS = {key: jsonschema.Draft4Validator(closed(schema)) for key, schema in CRD_SCHEMAS.items()}


def crd_errors(manifest):
    """Each way manifest breaks its CRD's schema, as one line."""
    validator = CRD_VALIDATORS[manifest["apiVersion"], manifest["kind"]]
    return [f"{'.'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(manifest)]


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
    committed = {
        f"{directory}/{path.name}": path.read_text()
        for directory in render.OUTPUT_DIRS
        for path in (K8S_DIR / directory).glob("*")
    }
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


@pytest.mark.parametrize("path", sorted(set(MANIFESTS) - set(CUSTOM)))
def test_every_manifest_is_a_valid_kubernetes_object(path):
    kubernetes_validate.validate(MANIFESTS[path], KUBERNETES_VERSION, strict=True)


def test_the_custom_resources_are_the_kinds_of_the_copied_crds():
    assert {(MANIFESTS[path]["apiVersion"], MANIFESTS[path]["kind"]) for path in CUSTOM} == set(CRD_SCHEMAS)


@pytest.mark.parametrize("path", CUSTOM)
def test_every_custom_resource_is_valid_against_its_crds_schema(path):
    assert crd_errors(MANIFESTS[path]) == []


@pytest.mark.parametrize(
    "path, mistake",
    [
        ("trainer/trainjob.json", lambda spec: spec["trainer"].update(numNode=2)),
        ("trainer/trainjob.json", lambda spec: spec["trainer"].update(numProcPerNode="gpu")),
        ("notebook/notebook.json", lambda spec: spec["template"]["spec"]["containers"][0].update(volumeMount=[])),
        ("notebook/notebook.json", lambda spec: spec["template"]["spec"].pop("containers")),
    ],
)
def test_the_crd_schemas_catch_a_misspelt_field_a_wrong_type_and_a_missing_one(path, mistake):
    manifest = json.loads(RENDERED[path])
    mistake(manifest["spec"])
    assert crd_errors(manifest)


@pytest.mark.parametrize("component", ["trainjob", "notebook"])
def test_the_pods_the_operators_make_are_valid_pods(component):
    """The CRDs' pod schemas lag Kubernetes': check the pod itself too."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": component}, "spec": POD_SPECS[component]}
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)


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


def test_trainjob_runs_the_jobs_training_on_the_torch_runtime_with_the_operators_rendezvous():
    train, spec = VALUES["train"], TRAINJOB["spec"]
    assert spec["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": VALUES["kubeflow"]["training_runtime"],
    }
    trainer = spec["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (train["nodes"], train["gpus_per_node"])
    # Bare torchrun: the operator's PET_* variables give the nodes, the rank and the master.
    job_args = main_container(POD_SPECS["train"])["args"]
    assert trainer["args"] == ["torchrun", *job_args[job_args.index("/opt/torchlab/train.py") :]]
    assert "command" not in trainer  # the image's entrypoint runs args as the user
    env_names = {variable["name"] for variable in trainer.get("env", [])}
    assert not env_names & set(kubeflow.node_env(TRAINJOB, 0))  # the webhook refuses the operator's own names
    # The same claim as the Indexed Job's.
    runs_mount = mounts_by_path(main_container(POD_SPECS["trainjob"]))[render.runs_path(VALUES)]
    runs_claim = volume(POD_SPECS["trainjob"], runs_mount["name"])["persistentVolumeClaim"]["claimName"]
    assert MANIFESTS["trainer/runs-claim.json"] == MANIFESTS["train/runs-claim.json"]
    assert MANIFESTS["trainer/runs-claim.json"]["metadata"]["name"] == runs_claim


def test_trainjob_passes_the_operators_checks_that_no_schema_holds():
    """The CEL rule on the name and the webhook's checks of runtimePatches (kubeflow/trainer v2.3.0:
    pkg/runtime/framework/plugins/jobset/jobset.go): a domain-prefixed manager, and no env on the node container."""
    name = TRAINJOB["metadata"]["name"]
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63
    (patch,) = TRAINJOB["spec"]["runtimePatches"]
    assert re.fullmatch(r"[a-z0-9]([-.a-z0-9]*[a-z0-9])?/[-._a-zA-Z0-9/]+", patch["manager"])
    (container,) = kubeflow.node_patch(TRAINJOB)["containers"]
    assert container["name"] == render.TRAINER_NODE and "env" not in container


def test_notebook_leaves_auth_to_the_gateway_and_the_prefix_to_the_controller():
    container = main_container(POD_SPECS["notebook"])
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env == {"JUPYTER_NO_AUTH": "yes"}
    variables = (ROOT / "image/start/variables.tsv").read_text().splitlines()
    assert any(line.startswith("JUPYTER_NO_AUTH\t") for line in variables)  # the image's own switch
    # No NB_PREFIX (the controller sets it, and keeps one given here), no ports (it adds 8888, its Service's target).
    assert "ports" not in container
    assert "readinessProbe" not in container and "livenessProbe" not in container  # they would need the prefix


def test_notebook_keeps_the_users_home_on_an_empty_claim_of_its_own():
    notebook = VALUES["kubeflow"]["notebook"]
    home_mount = mounts_by_path(main_container(POD_SPECS["notebook"]))[notebook["home"]]
    claim_name = volume(POD_SPECS["notebook"], home_mount["name"])["persistentVolumeClaim"]["claimName"]
    home_claim = MANIFESTS["notebook/home-claim.json"]
    assert home_claim["metadata"]["name"] == claim_name
    assert home_claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert NOTEBOOK["metadata"]["name"] == main_container(POD_SPECS["notebook"])["name"] == notebook["name"]


@pytest.mark.parametrize("path", CUSTOM)
def test_the_docs_show_the_custom_resources_as_rendered(path):
    """docs/deploying.md shows each Kubeflow manifest in full, as a YAML block headed `# k8s/<path>, as YAML`."""
    docs = (ROOT / "docs/deploying.md").read_text()
    shown = re.search(rf"```yaml\n# k8s/{re.escape(path)}, as YAML\n(.*?)```", docs, re.DOTALL)
    assert shown, f"docs/deploying.md shows no k8s/{path}"
    assert yaml.safe_load(shown.group(1)) == MANIFESTS[path], f"docs/deploying.md's k8s/{path} differs from k8s/"
