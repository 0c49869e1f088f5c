"""Every variable the container was started with reaches SSH sessions, interactive and
`ssh host CMD` alike, byte for byte; the secrets the entrypoint consumes do not."""

import json

import pytest

from helpers.jupyter import TOKEN
from helpers.ssh import ssh

PASSED = {
    "HTTPS_PROXY": "http://proxy.example:3128",
    "HF_TOKEN": "hf_abcdef0123456789",
    "WANDB_API_KEY": "0123456789abcdef",
    "PIP_INDEX_URL": "https://pypi.example/simple",
    "TRICKY_QUOTES": "it's \"quoted\" and 'single'",
    "TRICKY_SPACES": "  two  spaces  ",
    "TRICKY_DOLLAR": "$HOME ${PATH} $(id) `id` \\n",
    "TRICKY_NEWLINE": "first line\nsecond line\n",
    "TRICKY_UNICODE": "naïve café 東京 🚀",
}
DUMP = "python -c 'import json, os; print(json.dumps(dict(os.environ)))'"


@pytest.fixture(scope="module")
def container(module_containers, ssh_key):
    return module_containers.run(
        env={**PASSED, "JUPYTER_TOKEN": TOKEN, "SSH_PUBLIC_KEY": ssh_key[1], "JPY_API_TOKEN": "hub-secret"}
    )


@pytest.mark.parametrize(
    "command",
    [DUMP, f"bash -lc {json.dumps(DUMP)}", f"bash -ic {json.dumps(DUMP)}"],
    ids=["ssh host CMD", "login shell", "interactive shell"],
)
def test_container_variables_arrive_intact(container, ssh_key, command):
    out = ssh(container, ssh_key[0], command, options=("-t", "-t") if "-ic" in command else ()).stdout
    environ = json.loads(out.strip().splitlines()[-1])
    assert {name: environ.get(name) for name in PASSED} == PASSED
    assert environ["PATH"].startswith("/opt/env/bin:")


def test_interactive_terminal_session_has_them(container, ssh_key):
    out = ssh(container, ssh_key[0], options=("-tt",), input='printf \'%s|\' "$HF_TOKEN" "$TRICKY_UNICODE"\nexit\n')
    assert f"{PASSED['HF_TOKEN']}|{PASSED['TRICKY_UNICODE']}|" in out.stdout


def test_no_secret_reaches_a_session(container, ssh_key):
    env = ssh(container, ssh_key[0], "env; bash -lc env").stdout
    assert TOKEN not in env and "hub-secret" not in env
    assert "JUPYTER_TOKEN" not in env and "SSH_PUBLIC_KEY" not in env
    assert ssh_key[1].split()[1] not in env
    # Per-process variables are the session's own, not the container's.
    assert "HOME=/home/jovyan" in env.splitlines() and "USER=jovyan" in env.splitlines()
