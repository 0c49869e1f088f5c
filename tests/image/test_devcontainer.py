""".devcontainer/devcontainer.json opened by the real devcontainer CLI (what VS Code uses): the
project is mounted, writable by the user, with the env's Python; Jupyter runs as in `make run`."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers.docker import DOCKER, IMAGE, docker, wait_for

ROOT = Path(__file__).resolve().parents[2]
CLI = os.environ.get("DEVCONTAINER_CLI", str(ROOT / ".cache/devcontainer-cli/node_modules/.bin/devcontainer"))


def devcontainer(subcommand, *args, folder):
    result = subprocess.run(
        [CLI, subcommand, "--workspace-folder", str(folder), "--docker-path", DOCKER, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_devcontainer_opens_the_project_in_the_image(tmp_path):
    if not os.access(CLI, os.X_OK):
        pytest.skip(f"the devcontainer CLI is not installed at {CLI} (npm install @devcontainers/cli)")
    project = tmp_path / "project"
    shutil.copytree(ROOT / ".devcontainer", project / ".devcontainer")
    config = project / ".devcontainer/devcontainer.json"
    config.write_text(config.read_text().replace('"image": "torchlab"', f'"image": "{IMAGE}"'))
    (project / "notes.txt").write_text("mine\n")
    subprocess.run(["chown", "-R", "1000:100", str(project)], check=True)
    try:
        devcontainer("up", folder=project)
        probe = "id -un; pwd; command -v python; cat notes.txt; touch new"
        out = devcontainer("exec", "sh", "-c", probe, folder=project)
        assert out.split() == ["jovyan", "/workspace/project", "/opt/env/bin/python", "mine"]
        assert (project / "new").stat().st_uid == 1000
        name = docker("ps", "-q", "--filter", f"label=devcontainer.local_folder={project}").stdout.strip()
        wait_for(lambda: "Jupyter: http" in docker("logs", name).stderr, 60, "Jupyter in the dev container")
    finally:
        ids = docker("ps", "-aq", "--filter", f"label=devcontainer.local_folder={project}").stdout.split()
        if ids:
            docker("rm", "-f", "-v", *ids, check=False)
