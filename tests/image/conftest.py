"""Fixtures for tests of the built image: containers on host ports Docker picks, waited for by
condition (never a bare sleep) and always removed, and real clients (OpenSSH, HTTP, Chromium).
The helpers behind them are in tests/helpers. Every test here is marked `docker`.

The image under test is $TORCHLAB_IMAGE (default torchlab); the Docker CLI is $DOCKER.
"""

from pathlib import Path

import pytest

from helpers import browser
from helpers.docker import ContainerFactory, image_env
from helpers.jupyter import TOKEN
from helpers.ssh import new_key_pair

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.docker)


@pytest.fixture(scope="session")
def ssh_key(tmp_path_factory):
    """A fresh ed25519 key pair: (private key path, public key text)."""
    return new_key_pair(tmp_path_factory.mktemp("ssh") / "id_ed25519")


@pytest.fixture
def containers():
    factory = ContainerFactory()
    yield factory
    factory.remove_all()


@pytest.fixture(scope="module")
def module_containers():
    factory = ContainerFactory()
    yield factory
    factory.remove_all()


@pytest.fixture(scope="module")
def services(module_containers, ssh_key):
    """One running container with both services, a known token and the test key."""
    return module_containers.run(env={"JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1]})


@pytest.fixture(scope="session")
def production_image():
    """Skip a test that only the production (conda, CUDA 11.8) image can pass."""
    source = image_env().get("TORCHLAB_ENV_SOURCE")
    if source != "conda":
        pytest.skip(f"needs the production image (ENV_SOURCE=conda); this one was built with ENV_SOURCE={source}")


@pytest.fixture(scope="session")
def current_flavour():
    """Skip a test that only the current flavour (FLAVOUR=current) can pass."""
    flavour = image_env().get("TORCHLAB_FLAVOUR")
    if flavour != "current":
        pytest.skip(f"needs the current flavour (make build FLAVOUR=current); this image is the {flavour} flavour")


@pytest.fixture
def browser_page(tmp_path):
    """A headless Chromium with a fresh profile (helpers.browser); yields its one tab. Skips without Chromium."""
    with browser.headless_chromium(tmp_path) as page:
        yield page
