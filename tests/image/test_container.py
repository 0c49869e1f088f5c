"""testinfra checks inside a running container: packages, user, files, processes, sockets."""

import json
import re
import subprocess
from pathlib import Path

import pytest
import testinfra

from helpers.docker import DOCKER, IMAGE, docker, image_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def host(services):
    return testinfra.get_host(f"docker://root@{services.name}")


@pytest.mark.parametrize("package", ["openssh-server", "tini", "procps", "iproute2", "rsync", "tmux", "sudo"])
def test_runtime_packages_installed(host, package):
    assert host.package(package).is_installed


def test_user_follows_docker_stacks_contract(host):
    user = host.user("jovyan")
    assert (user.uid, user.gid, user.group) == (1000, 100, "users")
    assert user.home == "/home/jovyan"
    assert user.shell == "/bin/bash"
    assert host.file("/workspace").user == "jovyan"


def test_tini_is_pid_1(host):
    assert host.process.get(pid=1).comm == "tini"


def test_jupyter_runs_as_the_user_and_sshd_listener_as_root(host):
    jupyter = [p for p in host.process.filter() if "jupyter-notebook" in p.args or "jupyter notebook" in p.args]
    assert jupyter, "no Jupyter process"
    assert {p.user for p in jupyter} == {"jovyan"}
    assert all("allow-root" not in p.args and "allow_root" not in p.args for p in jupyter)
    sshd = [p for p in host.process.filter(comm="sshd")]
    assert sshd and {p.user for p in sshd} == {"root"}


def test_only_tini_the_entrypoint_and_sshd_run_as_root(host):
    # The container's own process tree: PID 1 and its descendants (docker exec probes have parent 0).
    rows = [line.split(None, 3) for line in host.check_output("ps -e -o pid=,ppid=,user=,comm=").splitlines()]
    tree = {"1"}
    for _ in rows:
        tree |= {pid for pid, ppid, _, _ in rows if ppid in tree}
    root_processes = {comm for pid, _, user, comm in rows if pid in tree and user == "root"}
    assert root_processes == {"tini", "entrypoint.sh", "sshd"}


@pytest.mark.parametrize("port", [2222, 8888])
def test_services_listen_on_ipv4_and_ipv6(host, port):
    assert host.socket(f"tcp://0.0.0.0:{port}").is_listening
    assert host.socket(f"tcp://:::{port}").is_listening


def test_env_is_first_on_path_for_docker_exec(host):
    assert host.check_output("command -v python") == "/opt/env/bin/python"
    assert host.check_output("command -v jupyter") == "/opt/env/bin/jupyter"


def test_env_has_the_pinned_torch_stack_of_its_flavour_and_pip_agrees(host):
    spec = "/opt/torchlab/envspec.py check --flavour $TORCHLAB_FLAVOUR /opt/torchlab/environment.yml"
    assert host.check_output(f"python {spec} && echo pins-ok").endswith("pins-ok")
    assert host.run("pip check").rc == 0


def test_no_host_keys_baked_into_the_image():
    listing = docker("run", "--rm", "--entrypoint", "ls", IMAGE, "/etc/ssh/", "/etc/ssh/host_keys/").stdout
    assert "sshd_config" in listing
    assert "ssh_host_" not in listing


def test_image_says_how_its_env_was_built(host):
    # /opt/env is a conda env (conda-meta/) on the conda path, the base Python's own prefix on the PyPI path:
    # no venv on either, so that the user site comes first and pip can uninstall from it.
    conda_env = host.file("/opt/env/conda-meta").is_directory
    assert not host.file("/opt/env/pyvenv.cfg").exists
    assert host.check_output("/opt/env/bin/python -I -c 'import sys; print(sys.prefix == sys.base_prefix)'") == "True"
    assert image_env()["TORCHLAB_ENV_SOURCE"] == ("conda" if conda_env else "pypi")


def test_production_python_is_3_10(host, production_image):
    assert host.check_output("python -c 'import sys; print(*sys.version_info[:2], sep=\".\")'") == "3.10"


def test_production_torch_is_the_cuda_11_8_build(host, production_image):
    assert host.check_output("python -c 'import torch; print(torch.version.cuda)'") == "11.8"


def test_the_current_flavour_is_python_3_13_with_blackwell_kernels(host, current_flavour):
    """Debian 13's Python; a torch for CUDA 12.8 or newer whose build lists Blackwell's kernels (no GPU needed)."""
    assert host.check_output("python -c 'import sys; print(*sys.version_info[:2], sep=\".\")'") == "3.13"
    assert host.check_output(". /etc/os-release && echo $VERSION_CODENAME") == "trixie"
    cuda, flags = host.check_output(
        "python -c 'import torch; print(torch.version.cuda); print(torch._C._cuda_getArchFlags())'"
    ).splitlines()
    assert tuple(map(int, cuda.split("."))) >= (12, 8)
    assert {"sm_100", "sm_120"} & set(flags.split()), flags


def test_oci_labels_say_what_and_which_revision():
    labels = json.loads(docker("image", "inspect", "--format", "{{json .Config.Labels}}", IMAGE).stdout)
    assert labels["org.opencontainers.image.title"] == "torchlab"
    for key in ["version", "revision", "source", "licenses"]:
        assert labels[f"org.opencontainers.image.{key}"], key
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", labels["org.opencontainers.image.revision"])
    assert labels["io.torchlab.env-source"] == image_env()["TORCHLAB_ENV_SOURCE"]
    assert labels["io.torchlab.flavour"] == image_env()["TORCHLAB_FLAVOUR"] in {"compat", "current"}


def test_the_labels_are_readable_inside_for_the_environment_record(host):
    """Processes in a container cannot read its image's labels: /opt/torchlab/image.json holds them."""
    labels = json.loads(docker("image", "inspect", "--format", "{{json .Config.Labels}}", IMAGE).stdout)
    inside = json.loads(host.file("/opt/torchlab/image.json").content_string)
    for key in ["version", "revision", "source"]:
        assert inside[key] == labels[f"org.opencontainers.image.{key}"], key
    assert inside["env_source"] == labels["io.torchlab.env-source"]
    assert inside["flavour"] == labels["io.torchlab.flavour"]
    assert inside["lock_file"] == labels["io.torchlab.lock-file"]


def test_make_tag_names_what_is_inside():
    result = subprocess.run(
        ["make", "-s", "tag", f"IMAGE={IMAGE}", f"DOCKER={DOCKER}", "VERSION=test"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    tag = result.stdout.strip().splitlines()[-1]
    try:
        assert re.fullmatch(rf"{re.escape(IMAGE)}:py3\d+-cu(\d+|cpu)-test", tag), tag
        python = docker("run", "--rm", "--entrypoint", "python", tag, "-c", "import sys; print(*sys.version_info[:2])")
        assert tag.split(":")[1].startswith("py" + "".join(python.stdout.split()))
    finally:
        docker("image", "rm", tag, check=False)
