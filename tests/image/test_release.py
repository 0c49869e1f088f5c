"""Releases: `make push` to a real registry (Debian's docker-registry, the CNCF distribution server) and
`make export-env`, whose output is committed under locks/ for each release."""

import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from helpers.docker import DOCKER, IMAGE, docker, wait_for
from helpers.host import require_tool
from helpers.jupyter import http_status
from helpers.ports import reserved_port

ROOT = Path(__file__).resolve().parents[2]
VERSION = (ROOT / "VERSION").read_text().strip()
MANIFEST_TYPES = ", ".join(
    [
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.index.v1+json",
    ]
)


def label(name):
    return docker("image", "inspect", "-f", f'{{{{index .Config.Labels "{name}"}}}}', IMAGE).stdout.strip()


def make(*args, timeout=120, check=True):
    return subprocess.run(
        ["make", "-s", *args, f"IMAGE={IMAGE}", f"DOCKER={DOCKER}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )


@pytest.fixture
def registry(tmp_path):
    """A registry on a reserved 127.0.0.1 port (helpers.ports), storing in tmp_path; the engine trusts
    127.0.0.0/8 over HTTP."""
    require_tool("docker-registry")
    port = reserved_port()
    config = tmp_path / "config.yml"
    config.write_text(
        "version: 0.1\n"
        f"storage:\n  filesystem:\n    rootdirectory: {tmp_path / 'storage'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    server = subprocess.Popen(
        ["docker-registry", "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: http_status(f"http://127.0.0.1:{port}/v2/") == 200, 30, "the registry to answer")
        yield f"127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(tmp_path / "storage", ignore_errors=True)  # gigabytes; pytest keeps its last tmp dirs


@pytest.mark.slow  # pushes the whole image: 523 s here
def test_make_push_publishes_the_image_under_what_is_inside_and_latest(registry):
    tags = []
    try:
        make("push", f"REGISTRY={registry}", "VERSION=test", timeout=1800)
        with urllib.request.urlopen(f"http://{registry}/v2/{IMAGE}/tags/list", timeout=30) as response:
            tags = json.load(response)["tags"]
        inside = [tag for tag in tags if tag != "latest"]
        assert "latest" in tags and len(inside) == 1 and inside[0].endswith("-test"), tags
        assert inside[0].startswith("py3"), tags

        # What the registry serves is what the engine built: the same manifest digest under both tags.
        digests = set()
        for tag in tags:
            request = urllib.request.Request(
                f"http://{registry}/v2/{IMAGE}/manifests/{tag}", method="HEAD", headers={"Accept": MANIFEST_TYPES}
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                digests.add(response.headers["Docker-Content-Digest"])
        repo_digests = json.loads(docker("image", "inspect", "--format", "{{json .RepoDigests}}", IMAGE).stdout)
        assert len(digests) == 1 and f"{registry}/{IMAGE}@{digests.pop()}" in repo_digests
    finally:
        names = [f"{registry}/{IMAGE}:{tag}" for tag in tags] + [f"{IMAGE}:{tag}" for tag in tags if tag != "latest"]
        for name in names:
            docker("image", "rm", name, check=False)


def test_make_push_without_registry_says_what_to_set():
    result = make("push", "REGISTRY=", check=False)

    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[0] == "make push: set REGISTRY, e.g. make push REGISTRY=ghcr.io/you"


def test_export_env_writes_the_lock_file_committed_for_this_release(tmp_path):
    result = make("export-env", f"LOCK_DIR={tmp_path}", timeout=300)

    written = Path(result.stdout.strip().splitlines()[-1].removeprefix("wrote "))
    source = label("io.torchlab.env-source")
    assert written.parent == tmp_path
    assert re.fullmatch(rf"py3\d+-cu(\d+|cpu)-{re.escape(VERSION)}\.{source}\.(yml|txt)", written.name), written.name
    assert written.read_text().strip() and not list(tmp_path.glob("*.tmp"))
    lock = label("io.torchlab.lock-file")
    if not lock:
        pytest.skip("the image was built without LOCK=locks/...: nothing committed to compare with")
    assert Path(lock).name == written.name, "the image was built from another release's lock file"
    assert (ROOT / lock).read_text() == written.read_text()
