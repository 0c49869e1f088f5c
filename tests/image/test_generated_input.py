"""Property-based bad input for the entrypoint: for any generated value of its variables the
container either sets up and runs the command, or stops with exit code 2 and one clear line
naming the variable, never a traceback, never a half-started container."""

import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.docker import IMAGE, docker, start_log

numbers = st.integers(min_value=-5, max_value=5_000_000_000).map(str)
words = st.text(alphabet=string.printable, max_size=12)
ports = st.one_of(st.integers(min_value=-1, max_value=70_000).map(str), words, st.just(""))
ids = st.one_of(numbers, words, st.sampled_from(["0", "1000", "100", "65534", "007", "4294967295"]))
names = st.one_of(words, st.sampled_from(["jovyan", "alice", "root", "daemon", "nobody", "a" * 33, "_x", "x-1"]))
flags = st.one_of(words, st.sampled_from(["yes", "no", "1", "0", "true", "false", ""]))
variables = st.fixed_dictionaries(
    {},
    optional={
        "NB_USER": names,
        "NB_UID": ids,
        "NB_GID": ids,
        "SSH_PORT": ports,
        "JUPYTER_PORT": ports,
        "GRANT_SUDO": flags,
        "CHOWN_HOME": flags,
        "JUPYTER_TOKEN": words,
        "SSH_PUBLIC_KEY": words,
    },
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(env=variables)
def test_any_environment_runs_or_fails_with_one_clear_line(env):
    env = {key: value for key, value in env.items() if "\0" not in value}
    env_args = [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
    result = docker("run", "--rm", *env_args, IMAGE, "sh", "-c", "echo set-up-done; id -un", check=False, timeout=120)
    assert "Traceback" not in result.stderr
    if result.returncode == 0:
        assert result.stdout.split()[0] == "set-up-done"
        assert result.stdout.split()[1] == (env.get("NB_USER") or "jovyan")  # empty means unset
    else:
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert start_log(lines[0], "ERROR") and "expected" in lines[0]
        assert any(name in lines[0] for name in env), (env, lines[0])
        assert "set-up-done" not in result.stdout
