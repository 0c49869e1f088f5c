"""Hardening: the image under load, faults and attack, with real clients. Figures are printed
(`make test` runs pytest with -s, so they show)."""

import concurrent.futures
import hashlib
import statistics
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from helpers.docker import IMAGE, SECRETS_IN_ENV, SERVICE_KILLED, docker, wait_for
from helpers.host import require_tool
from helpers.jupyter import TOKEN, api, base_url, execute, http_status
from helpers.ssh import SSH_OPTIONS, ssh

pytestmark = pytest.mark.slow

SESSIONS = 20
KERNELS = 10
ATTEMPTS = 50


def test_concurrent_ssh_sessions_all_succeed(services, ssh_key):
    def one(i):
        return ssh(services, ssh_key[0], f"python -c 'import torch; print({i} + 1)'", check=False, timeout=120)

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(SESSIONS) as pool:
        results = list(pool.map(one, range(SESSIONS)))
    failures = [r.stderr for r in results if r.returncode != 0]
    print(
        f"\n{SESSIONS} concurrent SSH sessions: {SESSIONS - len(failures)} succeeded in "
        f"{time.monotonic() - started:.1f} s"
    )
    assert not failures
    assert [r.stdout.strip() for r in results] == [str(i + 1) for i in range(SESSIONS)]


def test_concurrent_kernels_all_execute(services):
    def one(i):
        return execute(services, f"print({i} * 2)", timeout=180)

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(KERNELS) as pool:
        outputs = list(pool.map(one, range(KERNELS)))
    print(f"\n{KERNELS} kernels started at once: all executed in {time.monotonic() - started:.1f} s")
    assert [o.strip() for o in outputs] == [str(i * 2) for i in range(KERNELS)]


def test_jupyter_and_a_kernel_stay_responsive_while_a_2_process_training_run_uses_every_cpu(services, ssh_key):
    # A real training run started over SSH as a user would: 2 processes, each with its loader workers.
    ssh(services, ssh_key[0], "torchlab sample-data /tmp/load-data", timeout=300)
    run = (
        "nohup torchrun --standalone --nproc_per_node=2 train.py --data /tmp/load-data --arch resnet18 "
        "--image-size 64 --batch-size 16 --epochs 50 --run-dir /tmp/load-run > /tmp/load.log 2>&1 &"
    )
    ssh(services, ssh_key[0], run)
    try:
        wait_for(
            lambda: services.exec("grep", "-q", "images/s", "/tmp/load.log", check=False).returncode == 0,
            300,
            "the training run's first progress line",
            lambda: services.exec("tail", "-5", "/tmp/load.log", check=False).stdout,
        )
        latencies = []
        for _ in range(40):
            started = time.monotonic()
            assert http_status(base_url(services) + "/api/status", {"Authorization": f"token {TOKEN}"}) == 200
            latencies.append(time.monotonic() - started)
        started = time.monotonic()
        code = execute(services, "print(sum(range(1000)))", timeout=120)
        kernel_seconds = time.monotonic() - started
        still_training = services.exec("pgrep", "-f", "train.py --data /tmp/load-data", check=False).returncode == 0
    finally:
        ssh(services, ssh_key[0], "pkill -f '[t]orchrun --standalone' || true")
    p95 = statistics.quantiles(latencies, n=20)[-1]
    print(
        f"\nduring a 2-process training run: Jupyter API p95 {p95 * 1000:.0f} ms over {len(latencies)} "
        f"requests; a new kernel ran code in {kernel_seconds:.1f} s"
    )
    assert still_training, "the training run ended before the measurement did"
    assert code.strip() == "499500"
    assert p95 < 5.0


def test_brute_force_is_refused_and_the_key_still_works(services, ssh_key, tmp_path):
    require_tool("sshpass")
    wrong_key = tmp_path / "wrong"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong_key)], check=True)
    port = str(services.host_port(2222))

    def attempt(i):
        if i % 2:
            command = ["ssh", *SSH_OPTIONS, "-i", str(wrong_key), "-p", port, "jovyan@127.0.0.1", "true"]
        else:
            password_only = [
                "-o",
                "PubkeyAuthentication=no",
                "-o",
                "PreferredAuthentications=password,keyboard-interactive",
            ]
            ssh_command = ["ssh", *SSH_OPTIONS[2:], *password_only, "-p", port, "jovyan@127.0.0.1", "true"]
            command = ["sshpass", "-p", f"guess{i}", *ssh_command]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        results = list(pool.map(attempt, range(ATTEMPTS)))
    refused = sum(r.returncode != 0 and "Permission denied" in r.stderr for r in results)
    print(f"\n{ATTEMPTS} wrong-key and password attempts: {refused} refused")
    assert refused == ATTEMPTS
    assert ssh(services, ssh_key[0], "id -un").stdout.strip() == "jovyan"


API_PATHS = [
    "/api/contents",
    "/api/kernels",
    "/api/kernelspecs",
    "/api/sessions",
    "/api/terminals",
    "/api/me",
    "/api/config/notebook",
    "/api/nbconvert",
    "/api/status",
    "/metrics",
]
PAGE_PATHS = [
    "/files/notebooks",
    "/tree",
    "/notebooks/x.ipynb",
    "/edit/x.txt",
    "/terminals/1",
    "/lab",
    "/view/x.txt",
    "/nbconvert/html/x.ipynb",
]


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def status_and_location(url):
    """The first answer to url, redirects not followed: (status, Location header)."""
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(url, timeout=10) as response:
            return response.status, response.headers.get("Location", "")
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Location", "")


@pytest.mark.parametrize("path", API_PATHS)
def test_every_api_endpoint_refuses_a_request_without_the_token(services, path):
    assert status_and_location(base_url(services) + path) == (403, "")


@pytest.mark.parametrize("path", PAGE_PATHS)
def test_every_page_sends_a_request_without_the_token_to_the_login(services, path):
    login = "/login?" + urllib.parse.urlencode({"next": path})
    assert status_and_location(base_url(services) + path) == (302, login)


@pytest.mark.parametrize("path", ["/login", "/api", "/static/favicon.ico"])
def test_only_login_version_and_static_files_answer_without_the_token(services, path):
    assert http_status(base_url(services) + path) == 200


def test_effective_jupyter_config_keeps_xsrf_and_origins(services):
    config = services.exec(
        "python",
        "-c",
        "from jupyter_server.serverapp import ServerApp; a = ServerApp(); a.load_config_file(); "
        "print(a.disable_check_xsrf, repr(a.allow_origin), repr(a.allow_origin_pat), a.allow_root)",
        user="jovyan",
    ).stdout.split()
    assert config[:4] == ["False", "''", "''", "False"]
    # A browser on another site holds the login cookie but not the XSRF token: its writes are refused.
    jar = urllib.request.HTTPCookieProcessor()
    browser = urllib.request.build_opener(jar)
    with browser.open(base_url(services) + f"/tree?token={TOKEN}", timeout=10):
        pass
    assert any(cookie.name.startswith("username-") for cookie in jar.cookiejar)
    forged = urllib.request.Request(
        base_url(services) + "/api/contents/forged.txt",
        method="PUT",
        headers={"Origin": "http://evil.example", "Content-Type": "application/json"},
        data=b'{"type": "file", "format": "text", "content": "x"}',
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        browser.open(forged, timeout=10)
    assert refused.value.code == 403


def test_no_secret_in_world_readable_files_of_a_running_container(containers, tmp_path):
    password = "pw-" + hashlib.sha256(str(time.time()).encode()).hexdigest()[:16]
    container = containers.run(env={"JUPYTER_PASSWORD": password}, allowed_log=SECRETS_IN_ENV)
    token_container = containers.run(env={"JUPYTER_TOKEN": TOKEN})
    for target, secret in [(container, password), (token_container, TOKEN)]:
        # As `nobody`: what any other user in the container could read.
        found = target.exec(
            "sh", "-c", f"grep -rlsF '{secret}' / --exclude-dir=proc --exclude-dir=sys || true", user="nobody"
        ).stdout
        assert found.strip() == ""


def test_restart_policy_brings_it_back_with_the_same_host_keys_and_token(containers, ssh_key):
    volume = "torchlab-test-restart-" + hashlib.sha256(str(time.time()).encode()).hexdigest()[:8]
    try:
        container = containers.run(
            "--restart",
            "unless-stopped",
            "-v",
            f"{volume}:/etc/ssh/host_keys",
            env={"JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1]},
            allowed_log=SERVICE_KILLED,
        )
        before = container.exec("cat", "/etc/ssh/host_keys/ssh_host_ed25519_key.pub").stdout
        started = time.monotonic()
        container.exec("pkill", "-KILL", "-o", "-f", "/usr/sbin/sshd -D")  # a killed Jupyter is restarted inside
        wait_for(lambda: container.inspect()["RestartCount"] >= 1, 60, "Docker to restart the container")
        container.wait_ready()
        print(f"\nrecovered from a killed sshd in {time.monotonic() - started:.1f} s")
        assert container.exec("cat", "/etc/ssh/host_keys/ssh_host_ed25519_key.pub").stdout == before
        assert api(container, "/api/status")["started"]
        assert ssh(container, ssh_key[0], "id -un").stdout.strip() == "jovyan"
    finally:
        containers.remove_all()
        docker("volume", "rm", "-f", volume, check=False)


# The smallest set of capabilities the image needs; docs/configuration.md lists the same.
MINIMAL_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "SYS_CHROOT", "KILL"]


def test_runs_with_all_capabilities_dropped_but_the_documented_few(containers, ssh_key):
    caps = [arg for cap in MINIMAL_CAPS for arg in ("--cap-add", cap)]
    container = containers.run("--cap-drop", "ALL", *caps, env={"JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1]})
    assert ssh(container, ssh_key[0], "python -c 'print(6 * 7)'").stdout.strip() == "42"
    assert execute(container, "print(6 * 7)").strip() == "42"
    docker("stop", "-t", "2", container.name)
    assert container.state()["ExitCode"] == 0


def test_docs_list_the_minimal_capabilities():
    from test_entrypoint import ROOT

    configuration = (ROOT / "docs" / "configuration.md").read_text()
    assert "--cap-drop ALL " + " ".join(f"--cap-add {cap}" for cap in MINIMAL_CAPS) in configuration


READ_ONLY_MOUNTS = ["--read-only", "--tmpfs", "/run", "--tmpfs", "/tmp", "--tmpfs", "/home/jovyan:uid=1000,gid=100"]


def test_runs_with_a_read_only_root_filesystem(containers, ssh_key, tmp_path):
    workspace, data = tmp_path / "ws", tmp_path / "data"
    workspace.mkdir()
    data.mkdir()
    (data / "file.txt").write_text("read me")
    container = containers.run(
        *READ_ONLY_MOUNTS,
        "-v",
        f"{tmp_path}/keys:/etc/ssh/host_keys",
        "-v",
        f"{workspace}:/workspace",
        "-v",
        f"{data}:/data:ro",
        env={"JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1]},
    )
    assert ssh(container, ssh_key[0], "cat /data/file.txt && touch /workspace/new").stdout == "read me"
    assert execute(container, "print(open('/data/file.txt').read())").strip() == "read me"
    assert ssh(container, ssh_key[0], "touch /data/x", check=False).returncode != 0
    assert (workspace / "new").exists()


def test_docs_list_the_read_only_mounts():
    from test_entrypoint import ROOT

    assert " ".join(READ_ONLY_MOUNTS) in (ROOT / "docs" / "configuration.md").read_text()


def planted_files(workspace):
    files = {
        "notebooks/01-environment-check.ipynb": b"my own notebook, not the image's",
        "train.py": b"print('mine')\n",
        ".bashrc": b"# mine\n",
        "results/model.pt": bytes(range(256)) * 64,
    }
    for name, content in files.items():
        (workspace / name).parent.mkdir(parents=True, exist_ok=True)
        (workspace / name).write_bytes(content)
    return files


def test_user_files_in_workspace_survive_every_lifecycle_step(containers, tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    files = planted_files(workspace)
    subprocess.run(["chown", "-R", "1000:100", str(workspace)], check=True)

    def unchanged(step):
        for name, content in files.items():
            assert (workspace / name).read_bytes() == content, f"{name} changed after {step}"

    container = containers.run("-v", f"{workspace}:/workspace")
    unchanged("first start")
    docker("restart", "-t", "2", container.name)
    container.wait_ready()
    unchanged("restart")
    docker("stop", "-t", "2", container.name)
    unchanged("stop")
    docker("rm", container.name)
    containers.run("-v", f"{workspace}:/workspace", env={"NB_USER": "alice", "CHOWN_HOME": "yes"})
    unchanged("re-creation with other settings")
    docker("run", "--rm", "-v", f"{workspace}:/workspace", IMAGE, "true")
    unchanged("a one-off command")
