"""SSH from the host with the OpenSSH client: keys only, the env on PATH, what people do over SSH."""

import subprocess
from pathlib import Path

import pytest

from buildtools import envspec  # the repository root is on pytest's pythonpath (pyproject.toml)
from helpers.docker import image_env, wait_for
from helpers.host import require_tool
from helpers.jupyter import TOKEN, http_status
from helpers.ports import reserved_port
from helpers.ssh import SSH_OPTIONS, new_key_pair, ssh

ROOT = Path(__file__).resolve().parents[2]
PYTHON_CHECK = "import torch, sys; print(sys.version.split()[0], sys.executable, torch.__version__)"


def test_key_login_runs_python_in_the_env(services, ssh_key):
    # `ssh host CMD`: a non-login, non-interactive shell that reads no profile.
    out = ssh(services, ssh_key[0], f"python -c '{PYTHON_CHECK}'").stdout.split()
    assert out[1] == "/opt/env/bin/python"
    pins = envspec.pypi_pins(ROOT / "environment.yml", image_env()["TORCHLAB_FLAVOUR"])
    assert out[2].split("+")[0] == pins["torch"]


@pytest.mark.parametrize("shell", ["bash -lc", "bash -ic", "bash -lic"])
def test_env_is_first_on_path_in_login_and_interactive_shells(services, ssh_key, shell):
    out = ssh(services, ssh_key[0], f"{shell} 'command -v python'", options=["-tt"]).stdout
    assert out.strip().splitlines()[-1] == "/opt/env/bin/python"


def test_interactive_session_with_a_terminal_has_the_env(services, ssh_key):
    result = ssh(services, ssh_key[0], options=["-tt"], input="command -v python; exit\n")
    assert "/opt/env/bin/python" in result.stdout


def server_auth_methods(container, user):
    """The methods sshd offers after 'none', from the client's debug log."""
    target = ["-p", str(container.host_port(2222)), f"{user}@127.0.0.1", "true"]
    command = ["ssh", *SSH_OPTIONS, "-v", "-o", "PreferredAuthentications=none", *target]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    lines = [line for line in result.stderr.splitlines() if "Authentications that can continue" in line]
    assert lines, result.stderr
    return lines[-1].rsplit(":", 1)[1].strip().split(",")


def test_server_offers_public_key_only(services):
    assert server_auth_methods(services, "jovyan") == ["publickey"]


def test_password_login_is_refused(services):
    require_tool("sshpass")
    # The user has no password, so try what a password-guesser would: the user name, empty, common words.
    password_login = ["-o", "BatchMode=no", "-o", "PubkeyAuthentication=no"]
    password_login += ["-o", "PreferredAuthentications=password,keyboard-interactive"]
    ssh_command = ["ssh", *SSH_OPTIONS[2:], *password_login, "-p", str(services.host_port(2222)), "jovyan@127.0.0.1"]
    for password in ["jovyan", "", "password"]:
        command = ["sshpass", "-p", password, *ssh_command, "true"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
        assert result.returncode != 0
        assert "Permission denied" in result.stderr


def test_root_login_is_refused_even_with_an_authorized_key(services, ssh_key):
    services.exec("sh", "-c", f"mkdir -p /root/.ssh && echo '{ssh_key[1]}' > /root/.ssh/authorized_keys")
    try:
        result = ssh(services, ssh_key[0], "true", user="root", check=False)
        assert result.returncode == 255
        assert "Permission denied" in result.stderr
    finally:
        services.exec("rm", "-rf", "/root/.ssh")


def test_a_key_that_was_not_given_is_refused(services, tmp_path):
    other, _ = new_key_pair(tmp_path / "other")
    result = ssh(services, other, "true", check=False)
    assert result.returncode == 255 and "Permission denied" in result.stderr


def test_effective_sshd_config(services):
    config = services.exec("sshd", "-T", "-C", "user=jovyan,host=x,addr=127.0.0.1").stdout.lower().splitlines()
    for setting in [
        "passwordauthentication no",
        "kbdinteractiveauthentication no",
        "permitrootlogin no",
        "authenticationmethods publickey",
        "allowtcpforwarding yes",
        "subsystem sftp internal-sftp",
    ]:
        assert setting in config
    # OpenSSH 9.8+ only (the current flavour): no penalty for failed logins, which all arrive from Docker's address.
    assert "persourcepenalties no" in config or not any(line.startswith("persourcepenalt") for line in config)


def test_scp_sftp_and_rsync_move_files(services, ssh_key, tmp_path):
    port = str(services.host_port(2222))
    transport = f"ssh {' '.join(SSH_OPTIONS)} -i {ssh_key[0]} -p {port}"
    source = tmp_path / "data.bin"
    source.write_bytes(bytes(range(256)) * 1000)
    common = [*SSH_OPTIONS, "-i", str(ssh_key[0]), "-P", port]
    subprocess.run(["scp", *common, str(source), "jovyan@127.0.0.1:/workspace/by-scp.bin"], check=True, timeout=60)
    batch = tmp_path / "batch"
    batch.write_text(f"put {source} /workspace/by-sftp.bin\nget /workspace/by-scp.bin {tmp_path}/back.bin\n")
    subprocess.run(["sftp", *common, "-b", str(batch), "jovyan@127.0.0.1"], check=True, timeout=60, capture_output=True)
    require_tool("rsync")
    subprocess.run(
        ["rsync", "-a", "-e", transport, str(source), "jovyan@127.0.0.1:/workspace/by-rsync.bin"],
        check=True,
        timeout=60,
    )
    assert (tmp_path / "back.bin").read_bytes() == source.read_bytes()
    sums = ssh(services, ssh_key[0], "cd /workspace && sha256sum by-scp.bin by-sftp.bin by-rsync.bin").stdout
    assert len({line.split()[0] for line in sums.splitlines()}) == 1
    owners = ssh(services, ssh_key[0], "stat -c %u /workspace/by-scp.bin /workspace/by-rsync.bin").stdout.split()
    assert owners == ["1000", "1000"]


def test_local_forward_reaches_jupyter_through_the_tunnel(services, ssh_key):
    port = reserved_port()
    forward = ["-N", "-o", "ExitOnForwardFailure=yes", "-L", f"{port}:localhost:8888"]
    login = ["-i", str(ssh_key[0]), "-p", str(services.host_port(2222)), "jovyan@127.0.0.1"]
    tunnel = subprocess.Popen(["ssh", *SSH_OPTIONS, *forward, *login])
    try:
        url = f"http://127.0.0.1:{port}/api/status"
        wait_for(lambda: http_status(url, {"Authorization": f"token {TOKEN}"}) == 200, 30, "Jupyter via the tunnel")
        assert http_status(url) == 403
    finally:
        tunnel.terminate()
        tunnel.wait(timeout=10)


def test_tmux_session_outlives_the_ssh_connection(services, ssh_key):
    ssh(services, ssh_key[0], "tmux new-session -d -s work 'python -c \"import time; time.sleep(600)\"'")
    assert "work" in ssh(services, ssh_key[0], "tmux list-sessions").stdout
    ssh(services, ssh_key[0], "tmux kill-session -t work")


def test_nb_umask_reaches_every_way_in_over_ssh(containers, ssh_key, tmp_path):
    # sshd forces 022 into its sessions' umask: shells (through the session file) and sftp (its subsystem's
    # -u) take NB_UMASK's back; scp -O and rsync run in a shell.
    require_tool("rsync")
    container = containers.run(env={"JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1], "NB_UMASK": "002"})
    port = str(container.host_port(2222))
    assert ssh(container, ssh_key[0], "umask").stdout.strip() == "0002"
    assert ssh(container, ssh_key[0], "bash -lc umask").stdout.strip() == "0002"
    terminal = ssh(container, ssh_key[0], options=["-tt"], input="umask; exit\n").stdout
    assert "0002" in terminal.split(), terminal
    source = tmp_path / "shared.txt"
    source.write_text("for the team\n")
    source.chmod(0o666)
    common = [*SSH_OPTIONS, "-i", str(ssh_key[0]), "-P", port]
    batch = tmp_path / "batch"
    batch.write_text(f"put {source} /workspace/by-sftp.txt\n")
    subprocess.run(["sftp", *common, "-b", str(batch), "jovyan@127.0.0.1"], check=True, timeout=60, capture_output=True)
    subprocess.run(["scp", *common, str(source), "jovyan@127.0.0.1:/workspace/by-scp.txt"], check=True, timeout=60)
    subprocess.run(
        ["scp", "-O", *common, str(source), "jovyan@127.0.0.1:/workspace/by-scp-O.txt"], check=True, timeout=60
    )
    transport = f"ssh {' '.join(SSH_OPTIONS)} -i {ssh_key[0]} -p {port}"
    subprocess.run(
        ["rsync", "-e", transport, str(source), "jovyan@127.0.0.1:/workspace/by-rsync.txt"], check=True, timeout=60
    )
    made = ssh(container, ssh_key[0], "touch /workspace/by-ssh.txt; cd /workspace && stat -c '%n %a' by-*").stdout
    assert sorted(made.splitlines()) == [f"by-{how}.txt 664" for how in ("rsync", "scp-O", "scp", "sftp", "ssh")]
