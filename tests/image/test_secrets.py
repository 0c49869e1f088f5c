"""No secret in the image: not the build's CA bundle, not an SSH host key, not a token or key,
in any layer (deleted files included), in `docker history`, or in `docker image inspect`."""

import os
import re
import subprocess
import tarfile

import pytest

from helpers.docker import DOCKER, IMAGE, docker

CERT = re.compile(r"-----BEGIN CERTIFICATE-----\n(.*?)-----END CERTIFICATE-----", re.S)
SECRET_VARIABLES = {"JUPYTER_TOKEN", "JUPYTER_PASSWORD", "SSH_PUBLIC_KEY", "PUBLIC_KEY", "CA_BUNDLE"}


def certificates(pem_text):
    return {body.replace("\n", "") for body in CERT.findall(pem_text)}


@pytest.fixture(scope="module")
def build_only_certificates():
    """Base64 bodies of the certificates in the build's CA bundle that no public CA list in the image has:
    empty when the build had no CA_BUNDLE or it held only public certificates."""
    bundle = os.environ.get("TORCHLAB_CA_BUNDLE", "")
    if not bundle:
        return set()
    with open(bundle, encoding="utf-8") as f:
        used = certificates(f.read())
    # The public CA lists the image ships anyway: the system's and Python's (certifi).
    shipped = docker(
        "run",
        "--rm",
        "--entrypoint",
        "sh",
        IMAGE,
        "-c",
        'cat /etc/ssl/certs/ca-certificates.crt "$(python -m certifi)"',
    ).stdout
    return used - certificates(shipped)


class LayerScan:
    """Streams `docker save` once: records every path in every layer and looks for byte strings."""

    def __init__(self, needles):
        self.paths = []
        self.found = set()
        self.needles = needles
        self.overlap = max((len(n) for n in needles), default=0)

    def scan(self):
        save = subprocess.Popen([DOCKER, "save", IMAGE], stdout=subprocess.PIPE)
        with tarfile.open(fileobj=save.stdout, mode="r|") as image:
            for member in image:
                if not member.name.endswith("layer.tar"):
                    continue
                with tarfile.open(fileobj=image.extractfile(member), mode="r|") as layer:
                    for entry in layer:
                        self.paths.append(entry.name)
                        if entry.isfile() and self.needles:
                            self._search(layer.extractfile(entry), entry.name)
        assert save.wait() == 0
        return self

    def _search(self, stream, name):
        tail = b""
        while chunk := stream.read(1 << 20):
            window = tail + chunk
            self.found.update((name, needle[:24]) for needle in self.needles if needle in window)
            tail = window[-self.overlap :]


@pytest.fixture(scope="module")
def scanned(build_only_certificates):
    # A 64-character line from the middle of each certificate: unique to it, as stored in any PEM file.
    needles = {body[len(body) // 2 : len(body) // 2 + 64].encode() for body in build_only_certificates}
    return LayerScan(needles).scan()


def test_build_ca_bundle_is_in_no_layer(scanned, build_only_certificates):
    if not build_only_certificates:
        pytest.skip("the build used no CA_BUNDLE with certificates of its own, so there is nothing to look for")
    assert scanned.paths, "docker save produced no layer files"
    assert not scanned.found, f"CA certificates of the build found in the image: {sorted(scanned.found)}"
    assert not [p for p in scanned.paths if "secrets/ca_bundle" in p]


def test_no_ssh_host_key_in_any_layer(scanned):
    assert any(p.endswith("etc/ssh/sshd_config") for p in scanned.paths)
    host_keys = [p for p in scanned.paths if re.search(r"ssh_host_\w+_key", p)]
    assert not host_keys, host_keys


def test_history_and_config_hold_no_secrets(build_only_certificates):
    history = docker("history", "--no-trunc", IMAGE).stdout
    inspect = docker("image", "inspect", IMAGE).stdout
    for body in build_only_certificates:
        assert body[100:164] not in history and body[100:164] not in inspect
    assert "BEGIN CERTIFICATE" not in history + inspect
    assert "PRIVATE KEY" not in history + inspect


def test_image_config_sets_no_secret_variables():
    env = docker("image", "inspect", "--format", "{{range .Config.Env}}{{println .}}{{end}}", IMAGE).stdout
    names = {line.split("=", 1)[0] for line in env.splitlines() if line}
    assert not names & SECRET_VARIABLES
