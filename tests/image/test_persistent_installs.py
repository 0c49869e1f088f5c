"""What users install themselves lands on the /workspace volume and is still there, importable
from SSH and from Jupyter, after the container is re-created."""

import base64
import hashlib
import uuid
import zipfile

from helpers.docker import docker
from helpers.jupyter import TOKEN, execute
from helpers.ssh import ssh


def build_wheel(folder, name, value):
    """A minimal pure-Python wheel, made here so the test needs no package index."""
    files = {
        f"{name}/__init__.py": f"VALUE = {value!r}\n",
        f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{name}-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: torchlab-test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
        f"{len(text.encode())}"
        for path, text in files.items()
    ]
    files[f"{name}-1.0.dist-info/RECORD"] = "\n".join([*record, f"{name}-1.0.dist-info/RECORD,,"]) + "\n"
    wheel = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


def test_user_installs_and_venvs_survive_re_creation(containers, ssh_key, tmp_path):
    volume = "torchlab-test-work-" + uuid.uuid4().hex[:8]
    value = uuid.uuid4().hex
    wheel = build_wheel(tmp_path, "torchlab_probe", value)
    env = {"JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1]}
    try:
        first = containers.run("-v", f"{volume}:/workspace", env=env)
        docker("cp", str(wheel), f"{first.name}:/tmp/")
        ssh(first, ssh_key[0], f"pip install --user --no-index /tmp/{wheel.name}", timeout=120)
        ssh(first, ssh_key[0], "python -m venv --system-site-packages /workspace/venvs/mine", timeout=120)
        docker("rm", "-f", first.name)

        second = containers.run("-v", f"{volume}:/workspace", env=env)
        probe = "import torchlab_probe; print(torchlab_probe.VALUE)"
        assert ssh(second, ssh_key[0], f"python -c '{probe}'").stdout.strip() == value
        assert (
            ssh(second, ssh_key[0], "bash -lc 'python -c \"import torchlab_probe\" && echo login-ok'").stdout.strip()
            == "login-ok"
        )
        assert execute(second, probe).strip() == value
        venv = ssh(second, ssh_key[0], "/workspace/venvs/mine/bin/python -c 'import sys; print(sys.prefix)'")
        assert venv.stdout.strip() == "/workspace/venvs/mine"
    finally:
        containers.remove_all()
        docker("volume", "rm", "-f", volume, check=False)
