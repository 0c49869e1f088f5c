"""The GitHub workflows (.github/), which no machine here can run: `make lint` validates them against GitHub's
schema; these tests check what the schema cannot. Each check is a function of the files' text or parsed form,
run on the real files and again on a mutated copy that it must reject (a renamed target, a dropped matrix
entry, a branch trigger, an echoed secret)."""

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from buildtools import known_advisories  # the repository root is on pytest's pythonpath (pyproject.toml)

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github/workflows").glob("*.yml"))
MAKEFILE = (ROOT / "Makefile").read_text()
SECURITY = (ROOT / "docs/security.md").read_text()
WRAPPER = ROOT / ".github/ci/docker-with-flags"


def load(name):
    return yaml.safe_load((ROOT / ".github/workflows" / name).read_text())


def triggers(workflow):
    return workflow.get("on", workflow.get(True))  # YAML 1.1 reads the key `on` as true


def steps(workflow):
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


def scripts_run(workflow):
    """The shell of every run step, and of the repository's scripts those steps run (.ci/run), less comments."""
    texts = [step["run"] for step in steps(workflow) if "run" in step]
    texts += [(ROOT / path).read_text() for text in texts for path in re.findall(r"\.ci/[\w-]+", text)]
    return [re.sub(r"^\s*#.*$", "", text, flags=re.M) for text in texts]


# ---------------------------------------------------------------- make targets
def make_targets_called(shell):
    """The targets of each `make ...` command in a shell text (make where a command starts: a line, `$(`, a
    quoted trap, after `;`, `&&`, `||`, `|`): the words after make, less flags and VAR=value."""
    targets = set()
    command = r"(?:^|[;&|(`'])[ \t]*make((?:[ \t]+[^\s;&|)`'\"<>]+)+)"
    for words in re.findall(command, shell, flags=re.M):
        for word in words.split():
            if word.startswith("-") or "=" in word:
                continue
            if not re.fullmatch(r"[a-z][\w.-]*", word):
                break
            targets.add(word)
    return targets


def missing_targets(shells, makefile):
    defined = set(re.findall(r"^([^\s:#=]+)[ \t]*:(?!=)", makefile, flags=re.M))
    return {target for shell in shells for target in make_targets_called(shell)} - defined


def all_scripts():
    return [text for path in WORKFLOWS for text in scripts_run(yaml.safe_load(path.read_text()))]


def test_every_make_target_a_workflow_calls_exists():
    called = {target for text in all_scripts() for target in make_targets_called(text)}
    assert {"test", "run", "stop", "build", "export-env", "push", "tag", "gpu-check"} <= called
    assert missing_targets(all_scripts(), MAKEFILE) == set()


def test_a_renamed_target_is_caught():
    renamed = re.sub(r"^export-env:", "export-lock:", MAKEFILE, flags=re.M)
    assert missing_targets(all_scripts(), renamed) == {"export-env"}
    renamed = re.sub(r"^test:", "check:", MAKEFILE, flags=re.M)  # called only by .ci/run, which ci.yml runs
    assert missing_targets(all_scripts(), renamed) == {"test"}


# ---------------------------------------------------------------- the CI matrix
def env_sources():
    """The Dockerfile's env stages (FROM ... AS env-<ENV_SOURCE>), the values `make build` can be given."""
    return set(re.findall(r"^FROM \S+ AS env-(\w+)$", (ROOT / "Dockerfile").read_text(), flags=re.M))


def flavours():
    """{flavour: the env sources it can be built with}, from buildtools/flavours.tsv."""
    lines = (ROOT / "buildtools/flavours.tsv").read_text().splitlines()
    rows = [line.split("\t") for line in lines if not line.startswith(("#", "flavour\t"))]
    return {row[0]: set(row[1].split()) for row in rows}


def matrix_problems(ci, table):
    test = ci["jobs"]["test"]
    problems = []
    entries = test["strategy"]["matrix"]["include"]
    if sorted(entry["flavour"] for entry in entries) != sorted(table):
        problems.append(f"the matrix's flavours are {[entry['flavour'] for entry in entries]}, not {sorted(table)}")
    for entry in entries:
        if entry["env_source"] not in table.get(entry["flavour"], ()):
            problems.append(f"the {entry['flavour']} flavour cannot be built with ENV_SOURCE={entry['env_source']}")
    if "conda" not in {entry["env_source"] for entry in entries}:
        problems.append("no entry builds the production image (ENV_SOURCE=conda)")
    for variable, key in (("FLAVOUR", "flavour"), ("ENV_SOURCE", "env_source")):
        if test["env"].get(variable) != f"${{{{ matrix.{key} }}}}":
            problems.append(f"the job does not give make {variable} from the matrix")
    if test["env"].get("TORCHLAB_CI_OTHER_FLAVOURS") != "":
        problems.append("each job builds the other flavours too")
    if not any(re.search(r"\bbash \.ci/run$", step.get("run", "")) for step in test["steps"]):
        problems.append("no step runs .ci/run")
    return problems


def test_the_ci_matrix_tests_every_flavour_in_a_job_of_its_own_with_ci_run():
    assert env_sources() == {"conda", "pypi"} and set(flavours()) == {"compat", "current"}
    assert matrix_problems(load("ci.yml"), flavours()) == []


def test_ci_uploads_the_reports_make_writes():
    test = load("ci.yml")["jobs"]["test"]
    upload = next(s for s in test["steps"] if "upload-artifact" in s.get("uses", ""))
    assert upload["if"] == "always()"
    assert f"{test['env']['REPORTS']}/" in upload["with"]["path"].split()
    assert "$(call junit,static)" in MAKEFILE and "$(call junit,image)" in MAKEFILE


def test_a_dropped_matrix_entry_is_caught():
    ci = load("ci.yml")
    ci["jobs"]["test"]["strategy"]["matrix"]["include"].pop()
    assert matrix_problems(ci, flavours()) == ["the matrix's flavours are ['compat'], not ['compat', 'current']"]


def test_a_flavour_built_the_wrong_way_is_caught():
    ci = load("ci.yml")
    ci["jobs"]["test"]["strategy"]["matrix"]["include"][1]["env_source"] = "conda"
    assert matrix_problems(ci, flavours()) == ["the current flavour cannot be built with ENV_SOURCE=conda"]


# ---------------------------------------------------------------- the release
PUSHING = re.compile(r"\bmake push\b|\bdocker push\b|\bcosign sign\b|\bgh release\b")


def release_problems(release):
    on = triggers(release)
    problems = [f"triggered by {name}" for name in on if name not in ("push", "schedule")]
    if set(on.get("push") or {}) != {"tags"}:
        problems.append(f"a push triggers it by {sorted(on.get('push') or {})}, not by tags alone")
    for name, job in release["jobs"].items():
        checkout = next(
            (i for i, s in enumerate(job["steps"]) if 'git checkout --detach "refs/tags/' in s.get("run", "")), None
        )
        for i, step in enumerate(job["steps"]):
            pushes = PUSHING.search(step.get("run", "")) or "login-action" in step.get("uses", "")
            if pushes and (checkout is None or i < checkout):
                problems.append(f"job {name}: step {step.get('name', step.get('uses'))!r} before a tag is checked out")
    return problems


def test_the_release_pushes_only_from_a_version_tag():
    release = load("release.yml")
    assert triggers(release)["push"]["tags"] == ["v*.*.*"]
    assert any("make push" in step.get("run", "") for step in steps(release))
    assert release_problems(release) == []


def test_a_release_from_a_branch_is_caught():
    release = load("release.yml")
    release[True]["push"]["branches"] = ["main"]
    release[True]["pull_request"] = None
    assert release_problems(release) == [
        "triggered by pull_request",
        "a push triggers it by ['branches', 'tags'], not by tags alone",
    ]
    release = load("release.yml")
    job = release["jobs"]["release"]
    job["steps"] = [s for s in job["steps"] if s.get("id") != "tag"]
    assert "job release: step 'make push' before a tag is checked out" in release_problems(release)


def test_the_release_signs_and_attests_what_it_pushes():
    release = load("release.yml")
    job = release["jobs"]["release"]
    assert job["permissions"]["id-token"] == "write"
    assert (
        "--sbom=true" in job["env"]["TORCHLAB_BUILD_FLAGS"]
        and "--provenance=mode=max" in job["env"]["TORCHLAB_BUILD_FLAGS"]
    )
    assert job["env"]["DOCKER"].endswith("/.github/ci/docker-with-flags")
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    assert 'cosign sign --yes "$IMAGE"' in runs and "make -s export-env" in runs


# ---------------------------------------------------------------- secrets
def echoed_secrets(workflow):
    """Run steps that put a secret in the script itself, or print a variable a secret was put in."""
    found = []
    for step in steps(workflow):
        run = step.get("run", "")
        if re.search(r"\$\{\{\s*(secrets\.|github\.token)", run):
            found.append(f"{step.get('name', run[:40])!r} has a secret in its script")
        secret_vars = [
            name for name, value in (step.get("env") or {}).items() if re.search(r"secrets\.|github\.token", str(value))
        ]
        for name in secret_vars:
            if re.search(rf"\b(echo|printf)\b[^\n]*\$\{{?{name}\b", run):
                found.append(f"{step.get('name', run[:40])!r} prints ${name}")
    return found


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_no_secret_is_echoed(path):
    assert echoed_secrets(yaml.safe_load(path.read_text())) == []


def test_an_echoed_secret_is_caught():
    release = load("release.yml")
    release["jobs"]["release"]["steps"] += [
        {"name": "leak", "run": "echo ${{ secrets.GITHUB_TOKEN }}"},
        {"name": "leak2", "env": {"T": "${{ github.token }}"}, "run": 'printf "%s" "$T"'},
    ]
    assert echoed_secrets(release) == ["'leak' has a secret in its script", "'leak2' prints $T"]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_action_is_pinned_to_a_commit(path):
    uses = re.findall(r"^\s*(?:- )?uses: (\S+)(.*)$", path.read_text(), flags=re.M)
    assert uses
    for action, comment in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", action), f"{action} is not pinned to a commit"
        assert re.fullmatch(r" # v\d+\.\d+\.\d+", comment), f"{action}: its version is not named ({comment!r})"


# ---------------------------------------------------------------- the scan's allow-list
def test_the_scan_ignores_exactly_the_advisories_security_md_lists():
    assert known_advisories.known_advisories(SECURITY) == [
        ("torch 2.5.1", ["CVE-2025-32434", "GHSA-53q9-r3pm-6pq6"]),
        ("torch 2.5.1", ["CVE-2025-2953"]),
        ("torch 2.5.1", ["CVE-2025-3730"]),
    ]
    out = subprocess.run(
        [sys.executable, ROOT / "buildtools/known_advisories.py", "docs/security.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    ids = ["CVE-2025-32434", "GHSA-53q9-r3pm-6pq6", "CVE-2025-2953", "CVE-2025-3730"]
    assert [line for line in out.splitlines() if not line.startswith("#")] == ids
    scan = next(s["run"] for s in steps(load("release.yml")) if "trivy" in s.get("run", ""))
    assert "known_advisories.py docs/security.md > .cache/scan/trivyignore" in scan
    assert "--ignorefile /scan/trivyignore" in scan and "--exit-code 1" in scan


def ids_outside_the_table(page):
    """Advisory ids the page names but its table does not: tests/image/test_audit.py accepts an id named anywhere
    on the page, the scan only the table's, so the two lists agree only while this is empty."""
    listed = {i for _, ids in known_advisories.known_advisories(page) for i in ids}
    return set(known_advisories.ADVISORY_ID.findall(page)) - listed


def test_the_audit_and_the_scan_accept_the_same_advisories():
    assert ids_outside_the_table(SECURITY) == set()
    elsewhere = SECURITY.replace("## Licences\n", "## Licences\n\nCVE-2024-0001 does not apply here.\n")
    assert ids_outside_the_table(elsewhere) == {"CVE-2024-0001"}


@pytest.mark.parametrize(
    ("mutate", "error"),
    [
        (
            lambda t: t.replace("CVE-2025-32434 (GHSA-53q9-r3pm-6pq6)", "a flaw"),
            "the row of 'torch 2.5.1' names no CVE or GHSA id",
        ),
        (lambda t: t.replace("## Known-vulnerable pins", "## Pins"), 'no "## Known-vulnerable pins" section'),
    ],
)
def test_a_table_the_scan_cannot_read_stops_it_with_one_line(tmp_path, mutate, error):
    page = tmp_path / "security.md"
    page.write_text(mutate(SECURITY))
    result = subprocess.run(
        [sys.executable, ROOT / "buildtools/known_advisories.py", page], capture_output=True, text=True, check=False
    )
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.count("\n") == 1 and error in result.stderr


# ---------------------------------------------------------------- the Docker client the workflows give make
def run_wrapper(tmp_path, args, **env):
    """The wrapper with a fake docker first on PATH that logs each call and fails `buildx inspect`."""
    fake = tmp_path / "docker"
    fake.write_text('#!/bin/bash\necho "docker $*" >> "$(dirname "$0")/calls"\n[ "$1 $2" != "buildx inspect" ]\n')
    fake.chmod(0o755)
    path = f"{tmp_path}:{os.environ['PATH']}"
    subprocess.run([WRAPPER, *args], env={**os.environ, "PATH": path, **env}, check=True, capture_output=True)
    return (tmp_path / "calls").read_text().splitlines()


def test_the_wrapper_adds_the_flags_to_builds_only(tmp_path):
    flags = "--cache-from type=gha,scope=ci-conda --provenance=false"
    assert run_wrapper(tmp_path, ["image", "inspect", "torchlab"], TORCHLAB_BUILD_FLAGS=flags) == [
        "docker image inspect torchlab"
    ]
    assert run_wrapper(tmp_path, ["build", "-t", "torchlab", "."], TORCHLAB_BUILD_FLAGS=flags)[-1] == (
        f"docker buildx build {flags} -t torchlab ."
    )


def test_the_wrapper_makes_the_builder_it_is_told_to_use(tmp_path):
    calls = run_wrapper(tmp_path, ["build", "."], TORCHLAB_BUILDER="ci", TORCHLAB_BUILD_FLAGS="")
    assert calls == [
        "docker buildx inspect ci",
        "docker buildx create --name ci --driver docker-container",
        "docker buildx build --builder ci --load .",
    ]


# ---------------------------------------------------------------- the GPU runner
def test_gpu_check_runs_by_hand_on_a_gpu_runner_and_uploads_the_tables():
    workflow = load("gpu-check.yml")
    job = workflow["jobs"]["gpu-check"]
    assert set(triggers(workflow)) == {"workflow_dispatch"}
    assert job["runs-on"] == ["self-hosted", "gpu"]
    assert set(triggers(workflow)["workflow_dispatch"]["inputs"]["env_source"]["options"]) == {"auto"} | env_sources()
    assert triggers(workflow)["workflow_dispatch"]["inputs"]["flavour"]["options"] == list(flavours())
    assert job["env"]["FLAVOUR"] == "${{ inputs.flavour }}"
    upload = next(s for s in job["steps"] if "upload-artifact" in s.get("uses", ""))
    assert upload["with"]["path"] == ".cache/gpu-check/results/"
    assert "$(CURDIR)/.cache/gpu-check:/cache" in MAKEFILE and "--out-dir /cache/results" in MAKEFILE


def test_the_release_and_ci_schedules_rebuild_weekly():
    for name in ("ci.yml", "release.yml"):
        (schedule,) = triggers(load(name))["schedule"]
        minute, hour, day, month, weekday = schedule["cron"].split()
        assert (day, month, weekday) == ("*", "*", "1"), f"{name}: {schedule['cron']} is not once a week"
    ci_run = next(s for s in load("ci.yml")["jobs"]["test"]["steps"] if s.get("name") == "bash .ci/run")
    ci_flags = ci_run["env"]["TORCHLAB_BUILD_FLAGS"]
    assert "github.event_name != 'schedule' && format('--cache-from" in ci_flags


def run_version_step(repository, event, ref_name=""):
    """The release's `version` job's script, run in `repository`: (exit code, its outputs, its notices)."""
    script = next(s["run"] for s in load("release.yml")["jobs"]["version"]["steps"] if s.get("id") == "find")
    outputs = repository / "outputs"
    outputs.write_text("")
    env = {**os.environ, "EVENT": event, "GITHUB_REF_NAME": ref_name, "GITHUB_OUTPUT": str(outputs)}
    command = ["bash", "-e", "-c", script]
    result = subprocess.run(command, cwd=repository, env=env, capture_output=True, text=True, check=False)
    return result.returncode, outputs.read_text(), result.stdout


def test_the_weekly_release_without_a_version_tag_ends_cleanly_and_runs_no_release(tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "first"], check=True)

    assert run_version_step(tmp_path, "schedule") == (
        0,
        "",
        "::notice::release: no version tag (v*.*.*) yet: nothing to rebuild\n",
    )
    assert load("release.yml")["jobs"]["release"]["if"] == "needs.version.outputs.tag != ''"
    for tag in ("v0.1.0", "v0.10.0", "v0.9.2"):
        subprocess.run([*git, "tag", tag], check=True)
    assert run_version_step(tmp_path, "schedule")[:2] == (0, "tag=v0.10.0\n")
    assert run_version_step(tmp_path, "push", "v0.9.2")[:2] == (0, "tag=v0.9.2\n")


# ---------------------------------------------------------------- what a first hosted run trips on
def first_run_problems(workflows, ci_run):
    """Per workflow (name -> parsed): what the issue's list of likely failures names, where it is still there."""
    problems = []
    for name, workflow in workflows.items():
        if name != "gpu-check.yml" and (workflow.get("defaults") or {}).get("run", {}).get("shell") != "bash":
            problems.append(f"{name}: run steps are bash -e alone, without pipefail")
        for step in steps(workflow):
            if "actions/checkout" in step.get("uses", "") and (step.get("with") or {}).get("persist-credentials", True):
                problems.append(f"{name}: a checkout leaves the token in .git/config")
    test = workflows["ci.yml"]["jobs"]["test"]
    before_checkout = "".join(s.get("run", "") for s in itertools.takewhile(lambda s: "uses" not in s, test["steps"]))
    if 'git config --global --add safe.directory "$GITHUB_WORKSPACE"' not in before_checkout:
        problems.append("ci.yml: git refuses the checkout in the job container (dubious ownership)")
    own_socket = test["env"].get("DOCKER_HOST", "unix:///var/run/docker.sock") != "unix:///var/run/docker.sock"
    if not (own_socket and 'dockerd --host "$socket"' in ci_run):
        problems.append("ci.yml: the tests reach the runner host's engine, which lacks the job's paths and 127.0.0.1")
    flags = next(s for s in test["steps"] if s.get("name") == "bash .ci/run")["env"]["TORCHLAB_BUILD_FLAGS"]
    if "mode=min" not in flags:
        problems.append("ci.yml: the GHA cache exports every build stage")
    scan = next(s["run"] for s in steps(workflows["release.yml"]) if "trivy" in s.get("run", ""))
    if "--severity HIGH,CRITICAL" not in scan:
        problems.append("release.yml: the scan fails on every severity")
    if not re.search(r"^command -v npm >/dev/null \|\| apt-get install .* nodejs npm\b", ci_run, flags=re.M):
        problems.append(".ci/run: no npm, so the devcontainer and JupyterHub tests skip")
    return problems


def all_workflows():
    return {path.name: yaml.safe_load(path.read_text()) for path in WORKFLOWS}


def test_what_a_first_hosted_run_trips_on_is_answered():
    checkouts = [s for w in all_workflows().values() for s in steps(w) if "checkout" in s.get("uses", "")]
    assert len(checkouts) == 4 and all(s["with"]["persist-credentials"] is False for s in checkouts)
    assert first_run_problems(all_workflows(), (ROOT / ".ci/run").read_text()) == []


def test_each_first_run_failure_put_back_is_caught():
    workflows = all_workflows()
    del workflows["ci.yml"]["defaults"]
    workflows["release.yml"]["jobs"]["release"]["steps"][0]["with"]["persist-credentials"] = True
    git = workflows["ci.yml"]["jobs"]["test"]["steps"][0]
    git["run"] = git["run"].replace("safe.directory", "user.name")
    del workflows["ci.yml"]["jobs"]["test"]["env"]["DOCKER_HOST"]
    ci_run = (ROOT / ".ci/run").read_text().replace(" nodejs npm", "")
    assert first_run_problems(workflows, ci_run) == [
        "ci.yml: run steps are bash -e alone, without pipefail",
        "release.yml: a checkout leaves the token in .git/config",
        "ci.yml: git refuses the checkout in the job container (dubious ownership)",
        "ci.yml: the tests reach the runner host's engine, which lacks the job's paths and 127.0.0.1",
        ".ci/run: no npm, so the devcontainer and JupyterHub tests skip",
    ]


def run_tag_step(repository, tag, default_branch="main"):
    """The release job's tag checkout, run in a clone of `repository`: (exit code, stdout)."""
    script = next(s["run"] for s in load("release.yml")["jobs"]["release"]["steps"] if s.get("id") == "tag")
    (repository.parent / "outputs").write_text("")
    env = {
        **os.environ,
        "tag": tag,
        "DEFAULT_BRANCH": default_branch,
        "GITHUB_OUTPUT": str(repository.parent / "outputs"),
    }
    result = subprocess.run(
        ["bash", "-eo", "pipefail", "-c", script], cwd=repository, env=env, capture_output=True, text=True, check=False
    )
    return result.returncode, result.stdout


def test_the_release_takes_its_versions_lock_from_the_default_branch(tmp_path):
    origin, clone = tmp_path / "origin", tmp_path / "clone"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main", "-C", str(origin)]
    origin.mkdir()
    subprocess.run([*git, "init", "-q"], check=True)
    (origin / "VERSION").write_text("0.3.0\n")
    subprocess.run([*git, "add", "VERSION"], check=True)
    subprocess.run([*git, "commit", "-qm", "0.3.0"], check=True)
    subprocess.run([*git, "tag", "v0.3.0"], check=True)
    (origin / "locks").mkdir()
    for name in ("py313-cu132-0.3.0.pypi.txt", "py313-cu132-0.2.0.pypi.txt"):
        (origin / "locks" / name).write_text("torch==2.15.0\n")
    subprocess.run([*git, "add", "locks"], check=True)
    subprocess.run([*git, "commit", "-qm", "the release's lock"], check=True)
    subprocess.run(["git", "clone", "-q", str(origin), str(clone)], check=True)

    assert run_tag_step(clone, "v0.3.0") == (0, "release: locks/py313-cu132-0.3.0.pypi.txt from main\n")
    assert sorted(p.name for p in (clone / "locks").iterdir()) == ["py313-cu132-0.3.0.pypi.txt"]
    assert (tmp_path / "outputs").read_text() == "name=v0.3.0\n"
    assert run_tag_step(clone, "v0.3.0", default_branch="gone")[0] != 0


def runtime_stage_upgrades(dockerfile):
    """Whether the runtime stage upgrades the base's Debian packages before it installs its own: a base tag that
    upstream never rebuilds (Miniconda's) then still gets Debian's security updates in the weekly rebuilds."""
    runtime = dockerfile.split(" AS runtime\n", 1)[1]
    return bool(re.search(r"apt-get update \\\n && DEBIAN_FRONTEND=noninteractive apt-get upgrade -y \\\n", runtime))


def test_the_weekly_rebuilds_take_debians_security_updates():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert runtime_stage_upgrades(dockerfile)
    assert not runtime_stage_upgrades(dockerfile.replace("apt-get upgrade -y", "apt-get autoremove -y"))
