"""Fixtures for tests of the built image: containers on free host ports that are waited
for by condition (never a bare sleep) and always removed, and real clients (OpenSSH, HTTP).

The image under test is $TORCHLAB_IMAGE (default torchlab); the Docker CLI is $DOCKER.
"""

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid

import pytest
import websocket

IMAGE = os.environ.get("TORCHLAB_IMAGE", "torchlab")
DOCKER = os.environ.get("DOCKER", "docker")
TOKEN = "test-token-" + uuid.uuid4().hex
SSH_OPTIONS = [
    "-o", "BatchMode=yes",
    "-o", "StrictHostKeyChecking=no",
    "-o", "UserKnownHostsFile=/dev/null",
    "-o", "IdentitiesOnly=yes",
    "-o", "LogLevel=ERROR",
    "-o", "ConnectTimeout=10",
]  # fmt: skip


def docker(*args, check=True, timeout=120, **kwargs):
    """Run the Docker CLI; text output; raise with stderr on failure when check."""
    result = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout, check=False, **kwargs)
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def wait_for(condition, timeout, what, on_timeout=lambda: ""):
    """Poll condition() until it returns a truthy value; fail naming `what` after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{on_timeout()}")
        time.sleep(0.2)


def image_env():
    """The image's ENV as a dict."""
    config = json.loads(docker("image", "inspect", IMAGE).stdout)[0]["Config"]
    return dict(item.split("=", 1) for item in config["Env"])


class Container:
    def __init__(self, name):
        self.name = name

    def host_port(self, container_port):
        """The 127.0.0.1 port that Docker published container_port on."""
        out = docker("port", self.name, f"{container_port}/tcp").stdout.split()
        return int(out[0].rsplit(":", 1)[1])

    def logs(self):
        result = docker("logs", self.name, check=False)
        return result.stdout + result.stderr

    def inspect(self):
        return json.loads(docker("inspect", self.name).stdout)[0]

    def state(self):
        return self.inspect()["State"]

    def exec(self, *cmd, user="root", check=True):
        return docker("exec", "-u", user, self.name, *cmd, check=check)

    def wait_exited(self, timeout=30):
        wait_for(lambda: not self.state()["Running"], timeout, f"{self.name} to exit", self.logs)
        return self.state()["ExitCode"]

    def ssh_ready(self):
        return ssh_banner(self.host_port(2222)).startswith("SSH-2.0-")

    def jupyter_ready(self):
        return http_status(f"http://127.0.0.1:{self.host_port(8888)}/api") == 200

    def wait_ready(self, timeout=90):
        def ready():
            if not self.state()["Running"]:
                raise AssertionError(f"{self.name} exited early:\n{self.logs()}")
            return self.ssh_ready() and self.jupyter_ready()

        wait_for(ready, timeout, f"sshd and Jupyter in {self.name}", self.logs)


def ssh_banner(port):
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
            return sock.recv(256).decode(errors="replace")
    except OSError:
        return ""


def http_status(url, headers=None, method="GET", data=None):
    request = urllib.request.Request(url, headers=headers or {}, method=method, data=data)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


def jupyter_api(base, path, token, method="GET", body=None):
    """Call the Jupyter server at base (http://host:port[/prefix]) with a token; the JSON answer."""
    request = urllib.request.Request(
        base + path,
        method=method,
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
        data=json.dumps(body).encode() if body is not None else None,
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


def execute_in_kernel(base, code, token, timeout=60):
    """Start a kernel on the Jupyter server at base, run code over the kernel websocket, return its
    stdout, delete the kernel."""
    kernel = jupyter_api(base, "/api/kernels", token, method="POST", body={"name": "python3"})
    url = "ws" + base.removeprefix("http") + f"/api/kernels/{kernel['id']}/channels"
    conn = websocket.create_connection(url, timeout=timeout, header=[f"Authorization: token {token}"])
    try:
        msg_id = uuid.uuid4().hex
        conn.send(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "test",
                       "session": uuid.uuid4().hex, "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True},
        }))  # fmt: skip
        stdout, errors = [], []
        while True:
            msg = json.loads(conn.recv())
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                stdout.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                errors.append(msg["content"]["ename"] + ": " + msg["content"]["evalue"])
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        assert not errors, errors
        return "".join(stdout)
    finally:
        conn.close()
        jupyter_api(base, f"/api/kernels/{kernel['id']}", token, method="DELETE")


@pytest.fixture(scope="session")
def ssh_key(tmp_path_factory):
    """A fresh ed25519 key pair: (private key path, public key text)."""
    path = tmp_path_factory.mktemp("ssh") / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "torchlab-test", "-f", str(path)], check=True)
    return path, path.with_suffix(".pub").read_text().strip()


class ContainerFactory:
    """Starts containers of the image under test and removes every one it started."""

    def __init__(self):
        self.names = []

    def run(self, *docker_args, env=None, command=(), ready=True, shm_size="1g"):
        name = f"torchlab-test-{uuid.uuid4().hex[:10]}"
        env_args = [arg for key, value in (env or {}).items() for arg in ("-e", f"{key}={value}")]
        docker(
            "run", "-d", "--name", name, "--label", "torchlab.test=1", f"--shm-size={shm_size}",
            "-p", "127.0.0.1::2222", "-p", "127.0.0.1::8888",
            *env_args, *docker_args, IMAGE, *command,
        )  # fmt: skip
        self.names.append(name)
        container = Container(name)
        if ready:
            container.wait_ready()
        return container

    def remove_all(self):
        for name in self.names:
            docker("rm", "-f", "-v", name, check=False)


@pytest.fixture
def containers():
    factory = ContainerFactory()
    yield factory
    factory.remove_all()


@pytest.fixture(scope="module")
def module_containers():
    factory = ContainerFactory()
    yield factory
    factory.remove_all()


@pytest.fixture(scope="module")
def services(module_containers, ssh_key):
    """One running container with both services, a known token and the test key."""
    return module_containers.run(env={"JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1]})


def ssh(container, key, *command, user="jovyan", options=(), check=True, timeout=60, **kwargs):
    """Run command over a real OpenSSH session to the container."""
    result = subprocess.run(
        ["ssh", *SSH_OPTIONS, "-i", str(key), "-p", str(container.host_port(2222)), *options,
         f"{user}@127.0.0.1", *command],
        capture_output=True, text=True, timeout=timeout, check=False, **kwargs,
    )  # fmt: skip
    if check and result.returncode != 0:
        raise AssertionError(f"ssh {' '.join(command)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


@pytest.fixture(scope="session")
def production_image():
    """Skip a test that only the production (conda, CUDA 11.8) image can pass."""
    source = image_env().get("TORCHLAB_ENV_SOURCE")
    if source != "conda":
        pytest.skip(f"needs the production image (ENV_SOURCE=conda); this one was built with ENV_SOURCE={source}")


def require_tool(name):
    if shutil.which(name) is None:
        pytest.skip(f"{name} is not installed on this host")


@pytest.fixture
def browser_page(tmp_path):
    """A headless Chromium with a fresh profile (browser.py); yields its one tab. Skips without Chromium."""
    import browser

    with browser.headless_chromium(tmp_path) as page:
        yield page
