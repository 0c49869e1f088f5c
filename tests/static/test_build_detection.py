"""buildtools/detect-build, which decides what `make` builds with, run against fake Docker clients on a
fake PATH and probes pointed at closed or answering ports on 127.0.0.1; and `make -n run`."""

import http.server
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from helpers.ports import reserved_port

ROOT = Path(__file__).resolve().parents[2]
VERSION = (ROOT / "VERSION").read_text().strip()
DETECT = ROOT / "buildtools/detect-build"
MINICONDA = "continuumio/miniconda3:24.7.1-0"
DEBIAN_BASE = "torchlab/debian:bookworm"
CONDA_LOCK = f"py310-cu118-{VERSION}.conda.yml"  # what the conda path holds; no such lock is committed yet
# What the script runs besides docker and debootstrap, which each test provides or leaves out.
TOOLS = ["bash", "curl", "sed", "head", "cut", "awk", "tr", "sort", "find", "tail", "date", "cat", "dirname"]

FAKE_DOCKER = """#!/bin/bash
# A Docker client: version {version}, buildx {buildx}, engine {engine}; images as "name created" lines.
case "$1 $2" in
    "buildx version") [ {buildx} = yes ] ;;
    "version --format") echo {version} ;;
    "info "*) [ {engine} = up ] ;;
    "image inspect")
        created=$(sed -n "s|^${{@: -1}} ||p" "$(dirname "$0")/images")
        [ -n "$created" ] || exit 1
        [ "$3" = --format ] && echo "$created" || echo "[]" ;;
    *) exit 3 ;;
esac
"""


def closed_url():
    """A URL on a port nothing listens on, nor will while the test runs (helpers.ports)."""
    return f"http://127.0.0.1:{reserved_port()}/"


@pytest.fixture(scope="module")
def answering_url():
    """An HTTP server on 127.0.0.1 that answers every GET with 200."""

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


class FakeHost:
    """A PATH of links to the real tools plus fake docker clients (in PATH order) and, optionally, debootstrap."""

    def __init__(self, root):
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir()
        for tool in TOOLS:
            (self.bin / tool).symlink_to(shutil.which(tool))
        self.path = [self.bin]

    def docker(self, version="20.10.24", buildx="no", engine="up", images=()):
        folder = self.root / f"docker{len(self.path)}"
        folder.mkdir()
        client = folder / "docker"
        client.write_text(FAKE_DOCKER.format(version=version, buildx=buildx, engine=engine))
        client.chmod(0o755)
        (folder / "images").write_text("".join(f"{name} {created}\n" for name, created in dict(images).items()))
        self.path.append(folder)
        return str(client)

    def debootstrap(self):
        (self.bin / "debootstrap").symlink_to(shutil.which("true"))

    def run(self, mode, **variables):
        env = {"PATH": ":".join(map(str, self.path)), "HOME": str(self.root), "VERSION": VERSION}
        env |= {
            "TORCHLAB_PROBE_REGISTRY": closed_url(),
            "TORCHLAB_PROBE_CONDA": closed_url(),
            "TORCHLAB_PROBE_TORCH_INDEX": closed_url() + "whl/cu118",
        }
        env |= variables
        result = subprocess.run(
            ["bash", DETECT, mode], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        logs = result.stderr.splitlines()
        assert all(line.startswith("torchlab build: ") for line in logs), logs
        out = result.stdout.split("\n")[:-1]
        return result.returncode, out, [line.removeprefix("torchlab build: ") for line in logs]


@pytest.fixture
def host(tmp_path):
    return FakeHost(tmp_path)


def settings(lines):
    return dict(line.split("=", 1) for line in lines)


# ---------------------------------------------------------------- docker


def test_a_client_with_buildx_is_chosen(host):
    host.docker(version="28.2.2")
    with_buildx = host.docker(version="28.2.2", buildx="yes")

    assert host.run("docker", DOCKER="auto") == (0, [with_buildx], [f"docker client {with_buildx} (buildx)"])


def test_without_buildx_a_client_with_buildkit_built_in_is_chosen(host):
    newer = host.docker(version="28.2.2")
    debian = host.docker(version="20.10.24+dfsg1")

    rc, out, logs = host.run("docker", DOCKER="auto")

    assert (rc, out) == (0, [debian])
    assert logs == [f"docker client {debian} (BuildKit built in; {newer} has no buildx)"]


def test_a_client_without_buildkit_says_what_to_install(host):
    host.docker(version="28.2.2")

    rc, out, logs = host.run("docker", DOCKER="auto")

    assert (rc, out, len(logs)) == (2, [], 1)
    assert "apt-get install docker-buildx" in logs[0]


def test_no_client_says_to_install_docker(host):
    rc, out, logs = host.run("docker", DOCKER="auto")

    assert (rc, out) == (2, [])
    assert logs == ["no Docker client on PATH: install Docker (Debian: apt-get install docker.io)"]


def test_an_engine_that_is_not_running_says_how_to_start_it(host):
    host.docker(buildx="yes", engine="down")

    rc, out, logs = host.run("docker", DOCKER="auto")

    assert (rc, out, len(logs)) == (2, [], 2)
    assert logs[1].startswith("the Docker engine is not running") and "systemctl start docker" in logs[1]


def test_a_given_docker_wins_and_logs_nothing(host):
    host.docker(buildx="yes")
    given = host.docker(version="28.2.2")

    assert host.run("docker", DOCKER=given) == (0, [given], [])


# ---------------------------------------------------------------- ca-bundle


def test_the_ca_bundle_comes_from_ssl_cert_file_and_is_named(host, tmp_path):
    bundle = tmp_path / "proxy.pem"
    bundle.write_text("pem")

    rc, out, logs = host.run("ca-bundle", CA_BUNDLE="auto", SSL_CERT_FILE=str(bundle))

    assert (rc, out) == (0, [str(bundle)])
    named = f"CA bundle {bundle} (SSL_CERT_FILE), passed as the BuildKit secret ca_bundle (CA_BUNDLE= for none)"
    assert logs == [named]


@pytest.mark.parametrize(("given", "expected"), [("", 0), ("/no/such/bundle.pem", 2)])
def test_a_given_ca_bundle_wins_or_is_refused(host, given, expected):
    rc, out, logs = host.run("ca-bundle", CA_BUNDLE=given, SSL_CERT_FILE="/etc/hostname")

    assert rc == expected
    assert (out, logs) == (([""], []) if expected == 0 else ([], [f"CA_BUNDLE={given}: no such readable file"]))


# ---------------------------------------------------------------- env

AUTO = {"ENV_SOURCE": "auto", "BASE_IMAGE": "auto", "TORCH_INDEX_URL": "auto", "LOCK": "auto", "CA_BUNDLE": ""}


def test_air_gapped_with_the_debian_base_builds_pypi_from_it_with_the_release_lock(host):
    docker = host.docker(images={DEBIAN_BASE: "2026-01-01T00:00:00Z"})

    rc, out, logs = host.run("env", DOCKER=docker, **AUTO)

    assert rc == 0
    assert settings(out) == {
        "FLAVOUR": "compat",
        "ENV_SOURCE": "pypi",
        "BASE_IMAGE": DEBIAN_BASE,
        "TORCH_INDEX_URL": "",
        "LOCK": f"locks/py311-cu124-{VERSION}.pypi.txt",
    }
    assert [line.split(" ", 1)[0].rstrip(":") for line in logs] == [
        "ENV_SOURCE=pypi",
        f"BASE_IMAGE={DEBIAN_BASE}",
        "TORCH_INDEX_URL=",
        f"LOCK=locks/py311-cu124-{VERSION}.pypi.txt",
    ]
    assert "no registry answers" in logs[0] and "does not answer" in logs[2]


def test_air_gapped_without_the_debian_base_makes_it_first(host):
    docker = host.docker()
    host.debootstrap()

    rc, out, logs = host.run("env", DOCKER=docker, **AUTO)

    assert (rc, settings(out)["BASE_IMAGE"], settings(out).get("BUILD_FIRST")) == (0, DEBIAN_BASE, "base-debian")
    assert "made first by make base-debian" in logs[1]


def test_air_gapped_without_debootstrap_says_how_to_get_it(host):
    docker = host.docker()

    rc, out, logs = host.run("env", DOCKER=docker, **AUTO)

    assert (rc, out) == (2, [])
    assert "apt-get install debootstrap" in logs[-1] and "root" in logs[-1]


def test_miniconda_here_and_channels_answering_builds_conda(host, answering_url):
    docker = host.docker(images={MINICONDA: "2026-01-01T00:00:00Z"})

    rc, out, logs = host.run("env", DOCKER=docker, TORCHLAB_PROBE_CONDA=answering_url, **AUTO)

    assert rc == 0
    assert settings(out) | {"BASE_IMAGE": "-"} == {
        "FLAVOUR": "compat",
        "ENV_SOURCE": "conda",
        "BASE_IMAGE": "-",
        "TORCH_INDEX_URL": "",
        "LOCK": "",
    }
    assert logs[0].startswith("ENV_SOURCE=conda: ")
    assert logs[1] == f"LOCK= (environment.yml's pins): no lock file for this build (locks/{CONDA_LOCK})"


def test_miniconda_here_but_silent_channels_builds_pypi(host):
    docker = host.docker(images={MINICONDA: "2026-01-01T00:00:00Z", DEBIAN_BASE: "2026-01-01T00:00:00Z"})

    rc, out, logs = host.run("env", DOCKER=docker, **AUTO)

    assert (rc, settings(out)["ENV_SOURCE"]) == (0, "pypi")
    assert logs[0].startswith("ENV_SOURCE=pypi: the conda channels do not answer")


def test_a_registry_and_the_torch_index_answering_build_the_python_base_with_cu118(host, answering_url):
    docker = host.docker()
    index = f"{answering_url}/whl/cu118"

    rc, out, logs = host.run(
        "env", DOCKER=docker, TORCHLAB_PROBE_REGISTRY=answering_url, TORCHLAB_PROBE_TORCH_INDEX=index, **AUTO
    )

    assert rc == 0
    expected = {
        "FLAVOUR": "compat",
        "ENV_SOURCE": "pypi",
        "BASE_IMAGE": "python:3.10-slim",
        "TORCH_INDEX_URL": index,
        "LOCK": "",
    }
    assert settings(out) == expected
    assert logs[0].startswith("ENV_SOURCE=pypi: the conda channels do not answer")
    assert logs[-1].endswith(f"(locks/py310-cu118-{VERSION}.pypi.txt)")


def test_given_values_win_and_log_nothing(host):
    docker = host.docker()
    given = {"ENV_SOURCE": "pypi", "BASE_IMAGE": "debian:12", "TORCH_INDEX_URL": "", "LOCK": "", "CA_BUNDLE": ""}

    rc, out, logs = host.run("env", DOCKER=docker, **given)

    assert (rc, logs) == (0, [])
    assert settings(out) == {
        "FLAVOUR": "compat",
        "ENV_SOURCE": "pypi",
        "BASE_IMAGE": "debian:12",
        "TORCH_INDEX_URL": "",
        "LOCK": "",
    }


@pytest.mark.parametrize(
    ("given", "line"),
    [
        ({"ENV_SOURCE": "docker"}, "ENV_SOURCE=docker: expected auto, conda or pypi"),
        ({"LOCK": "locks/none.txt"}, "LOCK=locks/none.txt: no such file (a lock file under locks/, or LOCK= for none)"),
    ],
)
def test_bad_values_get_one_line(host, given, line):
    docker = host.docker(images={DEBIAN_BASE: "2026-01-01T00:00:00Z"})

    rc, out, logs = host.run("env", DOCKER=docker, **(AUTO | {"ENV_SOURCE": "pypi"} | given))

    assert (rc, out, logs[-1:]) == (2, [], [line])


# ---------------------------------------------------------------- flavours


def test_air_gapped_current_flavour_builds_pypi_on_trixie_made_first_with_pypis_torch(host):
    """FLAVOUR=current: PyPI alone (no conda probe), Debian 13 made by debootstrap where no registry answers, PyPI's
    torch (no index probed), and its own lock file."""
    docker = host.docker(images={MINICONDA: "2026-01-01T00:00:00Z"})
    host.debootstrap()

    rc, out, logs = host.run("env", DOCKER=docker, FLAVOUR="current", **AUTO)

    assert rc == 0, logs
    assert settings(out) == {
        "FLAVOUR": "current",
        "ENV_SOURCE": "pypi",
        "BASE_IMAGE": "torchlab/debian:trixie",
        "TORCH_INDEX_URL": "",
        "LOCK": f"locks/py313-cu132-{VERSION}.pypi.txt",
        "BUILD_FIRST": "base-debian",
    }
    assert logs[0] == "ENV_SOURCE=pypi: the current flavour is built from PyPI alone"
    assert logs[2] == "TORCH_INDEX_URL= (PyPI's default torch build): the current flavour's torch comes from PyPI"
    assert logs[3].startswith(f"LOCK=locks/py313-cu132-{VERSION}.pypi.txt: the release lock for this build")


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"FLAVOUR": "newest"}, "FLAVOUR=newest: expected compat or current (buildtools/flavours.tsv)"),
        (
            {"FLAVOUR": "current", "ENV_SOURCE": "conda"},
            "ENV_SOURCE=conda: the current flavour is built with ENV_SOURCE=pypi",
        ),
    ],
)
def test_a_flavour_that_cannot_be_built_so_is_refused_in_one_line(host, given, message):
    docker = host.docker(images={DEBIAN_BASE: "2026-01-01T00:00:00Z"})

    rc, out, logs = host.run("env", DOCKER=docker, **(AUTO | given))

    assert (rc, out, logs) == (2, [], [message])


def test_an_image_of_another_flavour_is_rebuilt(host):
    docker = host.docker(images={"torchlab-test": "2999-01-01T00:00:00Z current"})

    assert host.run("image", DOCKER=docker, IMAGE="torchlab-test", FLAVOUR="current")[1] == []
    rc, out, logs = host.run("image", DOCKER=docker, IMAGE="torchlab-test", FLAVOUR="compat")
    assert (rc, out, logs) == (0, ["build"], ["image torchlab-test is the current flavour, not compat: rebuilding it"])


@pytest.mark.parametrize(("flavour", "image"), [(None, "torchlab"), ("current", "torchlab-current")])
def test_make_builds_each_flavour_under_its_own_name(host, flavour, image):
    """A plain make builds the brief's flavour as torchlab; FLAVOUR=current builds torchlab-current beside it, so a
    later plain `make run` or `make test` still finds the brief's."""
    bases = {"torchlab/debian:bookworm": "2026-01-01T00:00:00Z", "torchlab/debian:trixie": "2026-01-01T00:00:00Z"}
    result = make_dry_run(host, "build", bases, *([f"FLAVOUR={flavour}"] if flavour else []), image=None)

    assert result.returncode == 0, result.stderr
    (build,) = [line for line in result.stdout.splitlines() if " build " in line]
    assert build.endswith(f" -t {image} .") and f"--build-arg FLAVOUR={flavour or 'compat'} " in build


# ---------------------------------------------------------------- image


@pytest.mark.parametrize(
    ("created", "verdict"),
    [(None, "build"), ("2000-01-01T00:00:00.5Z", "build"), ("2999-01-01T00:00:00.123456789Z", "")],
    ids=["absent", "older-than-its-sources", "newer-than-its-sources"],
)
def test_the_image_is_built_when_absent_or_older_than_its_sources(host, created, verdict):
    docker = host.docker(images={"torchlab-test": created} if created else {})

    rc, out, logs = host.run("image", DOCKER=docker, IMAGE="torchlab-test")

    assert (rc, out) == (0, [verdict] if verdict else [])
    assert len(logs) == 1
    assert ("older than" in logs[0]) == (created == "2000-01-01T00:00:00.5Z")


# ---------------------------------------------------------------- make


def make_dry_run(host, target, images, *variables, image="torchlab-test"):
    host.docker(buildx="yes", images=images)
    # Nor the Makefile's own variables: `make test-static DOCKER=...` exports DOCKER to this test.
    makefile_variables = set(re.findall(r"^([A-Z_]+) \?=", (ROOT / "Makefile").read_text(), flags=re.M))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS")) and k not in makefile_variables}
    env |= {
        "PATH": ":".join(map(str, host.path[1:])) + ":" + env["PATH"],
        "TORCHLAB_PROBE_REGISTRY": closed_url(),
        "TORCHLAB_PROBE_CONDA": closed_url(),
        "TORCHLAB_PROBE_TORCH_INDEX": closed_url() + "whl/cu118",
    }
    return subprocess.run(
        ["make", "-n", target, *([f"IMAGE={image}"] if image else []), "CA_BUNDLE=", *variables],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def docker_builds(result):
    return [line for line in result.stdout.splitlines() if " build " in line and "-t torchlab-test ." in line]


@pytest.mark.parametrize("data", ["sample", "given"])
def test_make_run_builds_the_image_when_it_is_absent(host, tmp_path, data):
    given = [f"DATA={tmp_path}"] if data == "given" else []
    result = make_dry_run(host, "run", {DEBIAN_BASE: "2026-01-01T00:00:00Z"}, *given)

    assert result.returncode == 0, result.stderr
    assert len(docker_builds(result)) == 1
    assert "torchlab build: image torchlab-test is not here: building it" in result.stderr.splitlines()
    assert "Stop:    make stop IMAGE=torchlab-test" in result.stdout


def test_make_run_does_not_build_an_image_newer_than_its_sources(host):
    result = make_dry_run(host, "run", {"torchlab-test": "2999-01-01T00:00:00Z"})

    assert result.returncode == 0, result.stderr
    assert docker_builds(result) == []


def test_make_help_shows_the_automatic_defaults():
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    shown = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.startswith("  ") and "[" in line}
    for name in ["DOCKER", "ENV_SOURCE", "BASE_IMAGE", "TORCH_INDEX_URL", "CA_BUNDLE", "LOCK"]:
        assert shown[name] == "[auto]", (name, shown.get(name))
