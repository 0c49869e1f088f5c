"""Jupyter from the host: auth on every path, a kernel that runs code in the env."""

import re
import urllib.parse
import urllib.request
import uuid

import pytest

from helpers.docker import SECRETS_IN_ENV, docker
from helpers.jupyter import TOKEN, api, base_url, execute, http_status


@pytest.mark.parametrize("path", ["/api/status", "/api/contents", "/api/kernels", "/api/terminals", "/api/sessions"])
def test_api_refuses_requests_without_the_token(services, path):
    assert http_status(base_url(services) + path) == 403
    assert http_status(base_url(services) + path, {"Authorization": "token wrong"}) == 403


def test_notebook_page_redirects_to_login_without_the_token(services):
    request = urllib.request.Request(base_url(services) + "/tree")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert "/login" in response.url


def test_api_answers_with_the_token(services):
    assert api(services, "/api/status")["started"]
    assert http_status(base_url(services) + f"/tree?token={TOKEN}") == 200


def test_kernel_executes_code_in_the_env(services):
    # The env's interpreter, however it is named (/opt/env links to the conda env, or the base Python's prefix).
    same_python = "os.path.realpath(sys.executable) == os.path.realpath('/opt/env/bin/python')"
    code = f"import sys, os, torch\nprint({same_python}, os.getuid(), torch.tensor([2, 3]).sum().item())"
    assert execute(services, code).split() == ["True", "1000", "5"]


def test_random_token_is_printed_in_a_ready_to_open_url(containers):
    container = containers.run()
    match = re.search(r"http://127\.0\.0\.1:8888/tree\?token=([0-9a-f]{48})", container.logs())
    assert match, container.logs()
    token = match.group(1)
    assert http_status(base_url(container) + "/api/status", {"Authorization": f"token {token}"}) == 200
    assert http_status(base_url(container) + "/api/status") == 403


def test_an_empty_token_still_gets_a_random_token(containers):
    container = containers.run(env={"JUPYTER_TOKEN": ""})
    assert http_status(base_url(container) + "/api/status") == 403
    assert re.search(r"token=[0-9a-f]{48}", container.logs())


def test_token_from_a_file(containers, tmp_path):
    secret = tmp_path / "token"
    secret.write_text("from-a-file-" + uuid.uuid4().hex + "\n")
    mount = f"{secret}:/run/secrets/token:ro"
    container = containers.run("-v", mount, env={"JUPYTER_TOKEN_FILE": "/run/secrets/token"})
    assert api(container, "/api/status", token=secret.read_text().strip())["started"]
    assert secret.read_text().strip() not in container.logs()
    assert secret.read_text().strip() not in docker("inspect", container.name).stdout


def login_with_password(container, password):
    """Log in through the login form; return the status of /api/status with the session cookie."""
    jar = urllib.request.HTTPCookieProcessor()
    opener = urllib.request.build_opener(jar)
    with opener.open(base_url(container) + "/login", timeout=10):
        pass
    xsrf = next(cookie.value for cookie in jar.cookiejar if cookie.name == "_xsrf")
    form = urllib.parse.urlencode({"password": password, "_xsrf": xsrf}).encode()
    try:
        with opener.open(base_url(container) + "/login?next=%2Ftree", data=form, timeout=10):
            pass
    except urllib.error.HTTPError:
        pass
    try:
        with opener.open(base_url(container) + "/api/status", timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_password_is_stored_only_as_an_argon2_hash(containers):
    password = "correct horse " + uuid.uuid4().hex
    container = containers.run(env={"JUPYTER_PASSWORD": password}, allowed_log=SECRETS_IN_ENV)
    assert login_with_password(container, "wrong password") == 403
    assert login_with_password(container, password) == 200
    pid = container.exec("pgrep", "-f", "jupyter-notebook|jupyter notebook").stdout.split()[0]
    environ = container.exec("cat", f"/proc/{pid}/environ", user="jovyan").stdout.replace("\0", "\n")
    assert password not in environ
    assert "TORCHLAB_JUPYTER_PASSWORD_HASH=argon2:" in environ
    assert password not in container.logs()
