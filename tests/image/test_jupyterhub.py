"""The image under a real JupyterHub: JupyterHub 5.2.1 on this host (a subprocess, with
configurable-http-proxy) spawns it with DockerSpawner on the local engine; a user logs in through
the hub's API, starts a server, reaches it through the proxy, runs torch in a kernel, and stops it.

The hub binds the gateway of a Docker network of its own, the one address on this host that both
the hub's process and the spawned container reach; the proxy and the hub's public side stay on
127.0.0.1. Everything it starts (hub, proxy, container, network) is removed at the end.
"""

import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from helpers.docker import IMAGE, docker, wait_for
from helpers.jupyter import execute_in_kernel, http_status
from helpers.ports import reserved_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CHP_VERSION = "4.6.2"
CHP_DIR = ROOT / ".cache/configurable-http-proxy"
CHP = CHP_DIR / "node_modules/.bin/configurable-http-proxy"
USER = "ada"
OWN_TOKEN = "a-token-of-its-own"  # in the spawner's environment: must not become a way in


def proxy_command():
    """configurable-http-proxy from npm, installed into .cache on first use."""
    if not CHP.exists():
        if shutil.which("npm") is None:
            pytest.skip(f"configurable-http-proxy is not at {CHP} and npm is missing to install it")
        result = subprocess.run(
            ["npm", "install", "--silent", "--prefix", str(CHP_DIR), f"configurable-http-proxy@{CHP_VERSION}"],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if result.returncode != 0:
            pytest.skip(f"npm could not install configurable-http-proxy: {result.stderr.strip()[-300:]}")
    return str(CHP)


def hub_config(workdir, gateway, network, admin_token, password, prefix, user, extra=None):
    """Writes the hub's jupyterhub_config.py (`extra`: settings added or replaced); returns its public URL."""
    ports = {"public": reserved_port(), "api": reserved_port(), "hub": reserved_port(gateway)}
    settings = {
        "JupyterHub.ip": "127.0.0.1",
        "JupyterHub.port": ports["public"],
        "JupyterHub.hub_ip": gateway,
        "JupyterHub.hub_port": ports["hub"],
        "JupyterHub.hub_connect_ip": gateway,
        "JupyterHub.db_url": f"sqlite:///{workdir}/jupyterhub.sqlite",
        "JupyterHub.cookie_secret_file": f"{workdir}/cookie_secret",
        "JupyterHub.authenticator_class": "jupyterhub.auth.DummyAuthenticator",
        "JupyterHub.spawner_class": "dockerspawner.DockerSpawner",
        "JupyterHub.services": [{"name": "torchlab-test", "api_token": admin_token}],
        "JupyterHub.load_roles": [
            {"name": "torchlab-test", "scopes": ["admin:users", "admin:servers"], "services": ["torchlab-test"]}
        ],
        "ConfigurableHTTPProxy.command": [proxy_command()],
        "ConfigurableHTTPProxy.api_url": f"http://127.0.0.1:{ports['api']}",
        "ConfigurableHTTPProxy.pid_file": f"{workdir}/proxy.pid",
        "DummyAuthenticator.password": password,
        "DockerSpawner.image": IMAGE,
        "DockerSpawner.cmd": ["jupyterhub-singleuser"],  # the image's CMD is empty, which DockerSpawner 13 refuses
        "DockerSpawner.pull_policy": "never",
        "DockerSpawner.network_name": network,
        "DockerSpawner.use_internal_ip": True,
        "DockerSpawner.remove": False,  # the test inspects the stopped container, then removes it
        "DockerSpawner.name_template": prefix + "-{username}",
        "DockerSpawner.environment": {"DOCTOR_AT_START": "no", "JUPYTER_TOKEN": OWN_TOKEN},
        "DockerSpawner.extra_create_kwargs": {"user": user} if user else {},
        # Start and stop answer at once with 202 (pending), and the test polls: one status code, where the
        # default 10 s wait answers 201/204 or 202 by how fast this host is.
        "JupyterHub.tornado_settings": {"slow_spawn_timeout": 0, "slow_stop_timeout": 0},
        "Spawner.start_timeout": 90,
        "Spawner.http_timeout": 90,
    }
    settings.update(extra or {})
    lines = ["c = get_config()  # noqa: F821"]
    lines += [f"c.{key} = {value!r}" for key, value in settings.items()]
    (workdir / "jupyterhub_config.py").write_text("\n".join(lines) + "\n")
    return f"http://127.0.0.1:{ports['public']}"


class Hub:
    def __init__(self, url, admin_token, password, prefix, log):
        self.url, self.admin_token, self.password, self.prefix, self.log = url, admin_token, password, prefix, log

    def api(self, path, token, method="GET", body=None):
        """The hub's REST API: (status, JSON answer or None)."""
        request = urllib.request.Request(
            f"{self.url}/hub/api{path}",
            method=method,
            headers={"Content-Type": "application/json", **({"Authorization": f"token {token}"} if token else {})},
            data=json.dumps(body).encode() if body is not None else None,
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, None

    def logs(self):
        return "hub log (last lines):\n" + "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])

    @property
    def container(self):
        return f"{self.prefix}-{USER}"


# DockerSpawner starts the container as root unless told otherwise; both ways must work.
@pytest.fixture(scope="module", params=[None, "1000:100"], ids=["root-start", "user-start"])
def hub(request, tmp_path_factory):
    try:
        import dockerspawner  # noqa: F401
    except ImportError:
        pytest.skip("dockerspawner is not installed in the test venv (pip install -r tests/requirements.txt)")
    tag = uuid.uuid4().hex[:8]
    prefix, network = f"torchlab-hubtest-{tag}", f"torchlab-hubtest-{tag}"
    workdir = tmp_path_factory.mktemp("hub")
    docker("network", "create", network)
    process = None
    try:
        gateway = docker("network", "inspect", network, "-f", "{{(index .IPAM.Config 0).Gateway}}").stdout.strip()
        admin_token, password = uuid.uuid4().hex, uuid.uuid4().hex
        url = hub_config(workdir, gateway, network, admin_token, password, prefix, request.param)
        log = workdir / "hub.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(Path(sys.executable).parent / "jupyterhub"), "-f", "jupyterhub_config.py"],
                cwd=workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        hub = Hub(url, admin_token, password, prefix, log)

        def up():
            assert process.poll() is None, f"the hub exited ({process.returncode})\n{hub.logs()}"
            return http_status(f"{url}/hub/api/") == 200

        wait_for(up, 60, "JupyterHub's API through the proxy", hub.logs)
        yield hub
    finally:
        tear_down_hub(process, workdir, prefix, network)


def tear_down_hub(process, workdir, prefix, network):
    """Stop the hub, remove the servers it spawned (named `prefix`...) and its network."""
    stop_hub(process, workdir)
    names = docker("ps", "-aq", "--filter", f"name={prefix}", check=False).stdout.split()
    if names:
        docker("rm", "-f", "-v", *names, check=False)
    docker("network", "rm", network, check=False)


def stop_hub(process, workdir):
    """SIGTERM lets the hub stop its proxy; what is still running after that is killed."""
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    pid_file = workdir / "proxy.pid"
    if pid_file.exists():
        subprocess.run(["kill", pid_file.read_text().strip()], capture_output=True, check=False)


@pytest.fixture(scope="module")
def user_token(hub):
    """The user, made by the admin service, logs in with its password through the hub's API."""
    assert hub.api(f"/users/{USER}", hub.admin_token, "POST")[0] == 201

    def log_in(password):
        return hub.api(f"/users/{USER}/tokens", None, "POST", {"auth": {"username": USER, "password": password}})

    assert log_in("wrong")[0] == 403
    status, answer = log_in(hub.password)
    assert status == 201, hub.logs()
    return answer["token"]


@pytest.fixture(scope="module")
def server(hub, user_token):
    """The user's server, started through the hub and waited for until the hub calls it ready."""
    status, _ = hub.api(f"/users/{USER}/server", user_token, "POST")
    assert status == 202, f"starting the server: HTTP {status}\n{hub.logs()}"

    def ready():
        model = hub.api(f"/users/{USER}", user_token)[1]
        spawn = model["servers"].get("")
        assert spawn, f"the spawn failed\n{hub.logs()}\n{docker('logs', hub.container, check=False).stderr}"
        return spawn["ready"]

    wait_for(ready, 100, "the spawned server to be ready", hub.logs)
    return f"{hub.url}/user/{USER}"


def test_the_spawned_server_answers_through_the_proxy_with_the_hubs_auth(server, user_token):
    auth = {"Authorization": f"token {user_token}"}
    assert http_status(f"{server}/api/status", auth) == 200
    assert http_status(f"{server}/api/status") == 403
    assert http_status(f"{server}/api/status", {"Authorization": "token wrong"}) == 403
    assert http_status(f"{server}/api/status", {"Authorization": f"token {OWN_TOKEN}"}) == 403
    # Notebook 7 and JupyterLab both
    assert http_status(f"{server}/tree", auth) == 200
    assert http_status(f"{server}/lab", auth) == 200


def test_a_kernel_imports_torch_in_workspace(server, user_token):
    out = execute_in_kernel(server, "import os, torch\nprint(os.getcwd(), os.getuid(), torch.__version__)", user_token)
    cwd, uid, version = out.split()
    assert (cwd, uid) == ("/workspace", "1000")
    assert version.startswith("2.")


def test_the_container_says_it_runs_the_singleuser_server_and_keeps_ssh(hub, server):
    logs = docker("logs", hub.container).stderr
    assert logs.count("JupyterHub: JUPYTERHUB_API_TOKEN is set") == 1, logs
    assert "JUPYTER_TOKEN/JUPYTER_PASSWORD ignored, the hub's login applies" in logs
    assert "Jupyter: http://127.0.0.1" not in logs and OWN_TOKEN not in logs  # no token of its own
    # the healthcheck: sshd's banner, and the singleuser server's /api under the hub's prefix
    assert docker("exec", hub.container, "torchlab-healthcheck", check=False).returncode == 0, logs
    ssh = docker("exec", hub.container, "bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/2222; head -c 8 <&3")
    assert ssh.stdout == "SSH-2.0-"


def test_stopping_through_the_hub_stops_the_container_cleanly(hub, server, user_token):
    status, _ = hub.api(f"/users/{USER}/server", user_token, "DELETE")
    assert status == 202, f"stopping the server: HTTP {status}\n{hub.logs()}"
    wait_for(lambda: not hub.api(f"/users/{USER}", user_token)[1]["servers"], 60, "the hub to stop it", hub.logs)
    state = json.loads(docker("inspect", hub.container).stdout)[0]["State"]
    assert (state["Running"], state["ExitCode"]) == (False, 0), docker("logs", hub.container).stderr
