"""What users install themselves lands on the /workspace volume and is still there, importable
from SSH and from Jupyter, after the container is re-created."""

import base64
import hashlib
import re
import uuid
import zipfile

from helpers.docker import IMAGE, docker, start_log, wait_for
from helpers.jupyter import TOKEN, execute
from helpers.ssh import ssh

# cycler: a package the image ships that neither Jupyter nor its kernels import on their own
CYCLER_VERSION = "import cycler; print(cycler.__version__)"


def build_wheel(folder, name, value, version="1.0"):
    """A minimal pure-Python wheel, made here so the test needs no package index."""
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VALUE = {value!r}\n__version__ = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: torchlab-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
        f"{len(text.encode())}"
        for path, text in files.items()
    ]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
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


def test_a_package_the_image_ships_can_be_changed_by_the_user(containers, ssh_key, tmp_path):
    """pip install over a package of the image's env lands on /workspace, is the one imported (SSH, a kernel),
    outlives the container and leaves the image's env as it was; an upgrade replaces it, and pip uninstall
    brings the image's version back."""
    volume = "torchlab-test-work-" + uuid.uuid4().hex[:8]
    image_version = docker("run", "--rm", "--entrypoint", "python", IMAGE, "-c", CYCLER_VERSION).stdout.strip()
    wheel = build_wheel(tmp_path, "cycler", "the user's", version="99.0")
    env = {"JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1]}
    try:
        first = containers.run("-v", f"{volume}:/workspace", env=env)
        docker("cp", str(wheel), f"{first.name}:/tmp/")
        ssh(first, ssh_key[0], f"pip install --no-index /tmp/{wheel.name}", timeout=120)  # as the user: --user
        docker("rm", "-f", first.name)

        second = containers.run("-v", f"{volume}:/workspace", env=env)
        assert ssh(second, ssh_key[0], f"python -c '{CYCLER_VERSION}'").stdout.strip() == "99.0"
        assert execute(second, CYCLER_VERSION).strip() == "99.0"
        torchrun = (
            f"echo '{CYCLER_VERSION}' >/tmp/probe.py && "
            "nohup torchrun --standalone --nproc-per-node 1 /tmp/probe.py >/tmp/probe.out 2>&1; cat /tmp/probe.out"
        )
        assert "99.0" in ssh(second, ssh_key[0], torchrun, timeout=120).stdout.split()
        shadowed = ssh(second, ssh_key[0], "torchlab doctor --data /nonexistent", check=False).stdout
        assert f"cycler {image_version} (image) is shadowed by 99.0 in /workspace/.local/" in shadowed
        # The start's report says so too, though it runs without the user site (nothing of the user's runs then).
        row = re.compile(
            rf"doctor: ok +your packages +cycler {re.escape(image_version)} \(image\) is shadowed by 99\.0"
        )
        wait_for(lambda: any(map(row.search, start_log(second.logs(), "INFO"))), 120, "the doctor's row", second.logs)
        # The image's env is untouched: root (docker exec) has no user site, and reads the image's own.
        assert docker("exec", second.name, "python", "-c", CYCLER_VERSION).stdout.strip() == image_version

        # An upgrade replaces the user's copy rather than leaving a second one beside it...
        upgrade = build_wheel(tmp_path, "cycler", "the user's next", version="99.1")
        docker("cp", str(upgrade), f"{second.name}:/tmp/")
        ssh(second, ssh_key[0], f"pip install --no-index /tmp/{upgrade.name}", timeout=120)
        copies = ssh(second, ssh_key[0], "ls -d /workspace/.local/lib/python3*/site-packages/cycler-*").stdout.split()
        assert [copy.rsplit("/", 1)[1] for copy in copies] == ["cycler-99.1.dist-info"]
        # ...and pip uninstall of it brings the image's version back, in SSH and in a kernel.
        ssh(second, ssh_key[0], "pip uninstall --yes cycler", timeout=120)
        assert ssh(second, ssh_key[0], f"python -c '{CYCLER_VERSION}'").stdout.strip() == image_version
        assert execute(second, CYCLER_VERSION).strip() == image_version
        doctor = ssh(second, ssh_key[0], "torchlab doctor --data /nonexistent", check=False).stdout
        assert "none shadows one of the image's" in doctor
    finally:
        containers.remove_all()
        docker("volume", "rm", "-f", volume, check=False)


def in_kernel(container, command):
    """A shell command run from a notebook's kernel, as `!command` would; its output."""
    run = f"subprocess.run({command!r}, shell=True, capture_output=True, text=True, check=True)"
    return execute(container, f"import subprocess; print({run}.stdout)")


# Each way in, and how it runs a command as the user: SSH, a Jupyter kernel, and an admin's `docker exec -u`,
# plain and through a login shell. Only SSH, the kernel and the login shell get PYTHONUSERBASE; the plain exec
# finds the volume through ~/.local.
WAYS_IN = {
    "ssh": lambda container, key, command: ssh(container, key[0], command, timeout=120).stdout,
    "kernel": lambda container, key, command: in_kernel(container, command),
    "docker exec -u": lambda container, key, command: container.exec("sh", "-c", command, user="jovyan").stdout,
    "docker exec -u, bash -l": lambda container, key, command: container.exec(
        "bash", "-lc", command, user="jovyan"
    ).stdout,
}


def test_the_user_site_is_on_the_volume_whichever_way_the_user_gets_in(containers, ssh_key, tmp_path):
    volume = "torchlab-test-work-" + uuid.uuid4().hex[:8]
    env = {"JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1]}
    # cycler 0.11.0 over the image's own cycler (the reported case: docker exec -u), a new package each other way.
    wheels = {way: build_wheel(tmp_path, f"probe_{index}", way) for index, way in enumerate(WAYS_IN)}
    wheels["docker exec -u"] = build_wheel(tmp_path, "cycler", "docker exec -u", version="0.11.0")
    try:
        first = containers.run("-v", f"{volume}:/workspace", env=env)
        for way, wheel in wheels.items():
            docker("cp", str(wheel), f"{first.name}:/tmp/")
            WAYS_IN[way](
                first, ssh_key, f"python -m pip install --user --no-index --no-warn-script-location /tmp/{wheel.name}"
            )
        docker("rm", "-f", first.name)

        second = containers.run("-v", f"{volume}:/workspace", env=env)
        names = ", ".join(wheel.name.split("-")[0] for wheel in wheels.values())
        probe = f"import os, {names}; print(*[os.path.realpath(m.__file__) for m in ({names})], sep=chr(10))"
        for way, run in WAYS_IN.items():
            found = run(second, ssh_key, f'python -c "{probe}"').split()
            assert len(found) == len(wheels) and all(path.startswith("/workspace/.local/lib/") for path in found), (
                way,
                found,
            )
        assert run(second, ssh_key, "python -c 'import cycler; print(cycler.VALUE)'").strip() == "docker exec -u"
    finally:
        containers.remove_all()
        docker("volume", "rm", "-f", volume, check=False)
