"""OpenSSH from the host: the client options every test uses, key pairs, the server's banner, commands run over ssh."""

import socket
import subprocess

SSH_OPTIONS = [
    arg
    for option in (
        "BatchMode=yes",
        "StrictHostKeyChecking=no",
        "UserKnownHostsFile=/dev/null",
        "IdentitiesOnly=yes",
        "LogLevel=ERROR",
        "ConnectTimeout=10",
    )
    for arg in ("-o", option)
]


def new_key_pair(path, comment="torchlab-test"):
    """A fresh ed25519 key pair at path (and path.pub): (private key path, public key text)."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)
    return path, path.with_suffix(".pub").read_text().strip()


def ssh_banner(port):
    """The first bytes sshd sends on 127.0.0.1:port; empty when nothing answers."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
            return sock.recv(256).decode(errors="replace")
    except OSError:
        return ""


def ssh(container, key, *command, user="jovyan", options=(), check=True, timeout=60, **kwargs):
    """Run command over a real OpenSSH session to the container."""
    target = ["-i", str(key), "-p", str(container.host_port(2222)), *options, f"{user}@127.0.0.1"]
    result = subprocess.run(
        ["ssh", *SSH_OPTIONS, *target, *command], capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )
    if check and result.returncode != 0:
        raise AssertionError(f"ssh {' '.join(command)} failed ({result.returncode}): {result.stderr.strip()}")
    return result
