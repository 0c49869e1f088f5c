"""train.py the way users run it: over a real SSH session with nohup, logged out, and stopped
by `docker stop` in the middle of a run."""

import json
import uuid

import pytest

from helpers.docker import docker, wait_for
from helpers.jupyter import TOKEN, http_status
from helpers.ssh import ssh

pytestmark = pytest.mark.slow

# Small and quick on 2 CPU cores; the flags are the user's, only the sizes are shrunk.
SAMPLE_DATA = "torchlab sample-data /workspace/sample-data"
TRAIN_FLAGS = (
    "--data /workspace/sample-data --arch resnet18 --image-size 48 --batch-size 16 --workers 2 --log-interval 5"
)


@pytest.fixture(scope="module")
def trainer(module_containers, ssh_key):
    container = module_containers.run(env={"JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1]}, shm_size="1g")
    ssh(container, ssh_key[0], SAMPLE_DATA, timeout=300)
    return container


def user_processes(container, pattern):
    return container.exec("pgrep", "-u", "jovyan", "-f", pattern, check=False).stdout.split()


def records(container, run_dir):
    text = container.exec("cat", f"/home/jovyan/{run_dir}/metrics.jsonl").stdout
    return [json.loads(line) for line in text.splitlines()]


def test_nohup_run_survives_logout_and_writes_checkpoints(trainer, ssh_key):
    ssh(trainer, ssh_key[0], f"nohup python train.py {TRAIN_FLAGS} --epochs 2 --run-dir runs/nohup > log.txt 2>&1 &")
    # The SSH session has ended (logged out); the run goes on without it.
    wait_for(
        lambda: not user_processes(trainer, "train.py .*runs/nohup"),
        600,
        "the nohup run to finish",
        lambda: trainer.exec("tail", "-5", "/home/jovyan/log.txt", check=False).stdout,
    )
    log = trainer.exec("cat", "/home/jovyan/log.txt").stdout
    assert "finished --epochs 2" in log, log
    assert "Traceback" not in log
    files = trainer.exec("ls", "/home/jovyan/runs/nohup").stdout.split()
    assert "config.json" in files
    assert any(name.startswith("checkpoint-") and name.endswith(".pt") for name in files)
    assert [r["epoch"] for r in records(trainer, "runs/nohup") if r["kind"] == "epoch"] == [0, 1]


def test_docker_stop_lets_a_run_started_over_ssh_checkpoint(containers, ssh_key, tmp_path):
    container = containers.run(env={"JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1]}, shm_size="1g")
    ssh(container, ssh_key[0], SAMPLE_DATA, timeout=300)
    ssh(container, ssh_key[0], f"nohup python train.py {TRAIN_FLAGS} --epochs 50 --run-dir runs/long > log.txt 2>&1 &")
    wait_for(
        lambda: container.exec("grep", "-q", "images/s", "/home/jovyan/log.txt", check=False).returncode == 0,
        300,
        "the run's first progress line",
    )
    docker("stop", "-t", "60", container.name, timeout=90)
    assert container.state()["ExitCode"] == 0
    # The stopped container's files are still there to read.
    docker("cp", f"{container.name}:/home/jovyan/", str(tmp_path / "home"))
    log = (tmp_path / "home/log.txt").read_text()
    assert "stopped by SIGTERM" in log, log
    assert list((tmp_path / "home/runs/long").glob("checkpoint-*.pt"))


def test_default_run_resumes_after_the_container_is_recreated_on_the_volume(containers, ssh_key):
    volume = "torchlab-test-runs-" + uuid.uuid4().hex[:8]
    env = {"JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1]}
    # The README's command, with the run dir left at its default.
    command = f"python train.py {TRAIN_FLAGS} --epochs 2 --resume auto"
    try:
        first = containers.run("-v", f"{volume}:/workspace", env=env, shm_size="1g")
        ssh(first, ssh_key[0], SAMPLE_DATA, timeout=300)
        out = ssh(first, ssh_key[0], command + " --max-steps 3", timeout=600).stdout
        assert "stopped by --max-steps 3" in out
        docker("rm", "-f", first.name)

        second = containers.run("-v", f"{volume}:/workspace", env=env, shm_size="1g")
        out = ssh(second, ssh_key[0], command, timeout=600).stdout
        assert "resumed from /workspace/runs/default/checkpoint-00000003.pt" in out, out
        assert "finished --epochs 2" in out
        # Jupyter, rooted at /workspace, shows the run.
        url = f"http://127.0.0.1:{second.host_port(8888)}/api/contents/runs/default"
        assert http_status(url, {"Authorization": f"token {TOKEN}"}) == 200
    finally:
        containers.remove_all()
        docker("volume", "rm", "-f", volume, check=False)
