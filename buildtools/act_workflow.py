"""What `make ci-act` (.ci/act) gives act: the actions the workflows pin, read from their `uses:` lines (the one
list of them), and each workflow as this machine can run it, which differs from the real file only where this
machine lacks what GitHub's runner has (DEVIATIONS, MOUNTS, GHA_CACHE; docs/building.md names each).

    python3 buildtools/act_workflow.py actions WORKFLOW...       # OWNER/REPO@COMMIT, one a line
    python3 buildtools/act_workflow.py rewrite WORKFLOW OUT KEY=PATH... [registry=HOST:PORT]  # KEY: MOUNTS' keys
    python3 buildtools/act_workflow.py options KEY=PATH...       # act's --container-options for the other jobs
    python3 buildtools/act_workflow.py env                       # act's --env for every job
"""

import re
import sys
from pathlib import Path

import yaml

USES = re.compile(r"([\w.-]+/[\w.-]+)@([0-9a-f]{40})")

# What --privileged gives a job's own Docker engine, less CAP_SYS_RESOURCE, which is not in this machine's bounding
# set (a --privileged container cannot start here): every other capability, no seccomp or AppArmor profile, /proc
# and /sys unmasked, the cgroup tree writable.
CAPABILITIES = """CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP LINUX_IMMUTABLE
    NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE
    SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP
    MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ""".split()
PRIVILEGED_BUT_SYS_RESOURCE = " ".join(
    [*(f"--cap-add {name}" for name in CAPABILITIES)]
    + [f"--security-opt {option}" for option in ("seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined")]
    + ["-v /sys/fs/cgroup:/sys/fs/cgroup:rw"]
)
# Each change a job container gets here, and why: (what the workflow says, what act is given instead).
DEVIATIONS = {
    "image": ("debian:12", "torchlab/debian:bookworm"),  # no registry: `make base-debian`'s debootstrapped bookworm
    "options": ("--privileged", PRIVILEGED_BUT_SYS_RESOURCE),
}
# Host paths the runner has and this machine does not, by the key the caller gives their stand-in under, and the
# mounts only this machine needs (the runner has its own node and trusts no intercepting proxy).
MOUNTS = {
    "plugins": "/usr/libexec/docker/cli-plugins",  # the runner's Docker CLI plugins: Debian trixie's docker-buildx
    "node": "/usr/local/bin/node",  # act runs JavaScript actions on the container's node; the runner mounts its own
    "ca": "/usr/local/share/ca-certificates/torchlab-act-machine.crt",  # this machine's TLS-intercepting CA
}


# A step's BuildKit builder and GHA cache: a `docker-container` builder runs the image moby/buildkit, which no
# registry here serves, so the build runs on the engine's own BuildKit, which cannot export a cache.
GHA_CACHE = re.compile(
    r"\$\{\{(?:(?!\}\}).)*--cache-from type=gha(?:(?!\}\}).)*\}\}|--cache-to type=gha(?:\$\{\{.*?\}\}|\S)*", re.S
)
EXTRA = ("node", "ca")  # the mounts every job's container gets here
# The images a job builds, named apart from `make build`'s: this machine's engine is shared with others' work.
IMAGE = "torchlab-act-${{ matrix.flavour }}"


class Unusable(Exception):
    """A workflow the rewrite does not know how to run here."""


def pinned_actions(texts):
    """The sorted (OWNER/REPO, COMMIT) pairs of every `uses:` of the workflow texts; a `uses:` not pinned to a
    commit is an error (tests/static/test_workflows.py requires pins)."""
    found = set()
    for text in texts:
        for step in (s for job in yaml.safe_load(text)["jobs"].values() for s in job.get("steps", [])):
            if "uses" in step:
                match = USES.fullmatch(step["uses"])
                if not match:
                    raise Unusable(f"{step['uses']} is not OWNER/REPO@COMMIT")
                found.add(match.groups())
    return sorted(found)


def for_this_machine(workflow, paths, registry=None):
    """A copy of the parsed workflow whose job containers get DEVIATIONS and MOUNTS (paths: MOUNTS' key -> the
    stand-in's path on this machine); with a registry, a job that pushes ends at its push, into that registry."""
    jobs = {}
    for name, real_job in workflow["jobs"].items():
        job = dict(real_job)
        if "container" in job:
            container = dict(job["container"])
            for key, (real, here) in DEVIATIONS.items():
                if container.get(key) != real:
                    raise Unusable(f"job {name}: container {key} is {container.get(key)!r}, not {real!r}")
                container[key] = here
            volumes = []
            for volume in container.get("volumes", []):
                source, rest = volume.split(":", 1)
                if source == MOUNTS["plugins"]:
                    source = paths["plugins"]
                volumes.append(f"{source}:{rest}")
            volumes += [f"{paths[key]}:{MOUNTS[key]}:ro" for key in EXTRA]
            container["volumes"] = volumes
            job["container"] = container
        job["steps"] = [on_the_engines_buildkit(step) for step in job.get("steps", [])]
        if "FLAVOUR" in job.get("env", {}):
            job["env"] = {**job["env"], "IMAGE": IMAGE}
        if registry and any(step.get("id") == "push" for step in job["steps"]):
            job = release_until_push(name, job, registry)
        jobs[name] = job
    # PyYAML reads the key `on` as true (YAML 1.1); act needs it back as `on`.
    return {("on" if key is True else key): value for key, value in {**workflow, "jobs": jobs}.items()}


# The release here ends at its push, into a local registry: the steps before it that need what this machine lacks
# are left out, by name, each for its reason.
LEFT_OUT = {
    "Room for the image, and the containerd image store (attestations)": "it restarts the runner's engine into the "
    "containerd image store; this engine (Docker 20.10) has none, and is not the job's to restart",
    "Vulnerability scan (fails on any finding docs/security.md does not list)": "Trivy's image and database come from "
    "registries this machine does not reach",
}


def release_until_push(name, job, registry):
    """The release job up to its push, into `registry` rather than ghcr.io (no login: the local registry takes
    anonymous pushes), with no attestations (the containerd image store is not here)."""
    steps, names = [], {step.get("name") for step in job["steps"]}
    if not set(LEFT_OUT) <= names:
        raise Unusable(f"job {name}: no step named {sorted(set(LEFT_OUT) - names)[0]!r}")
    for step in job["steps"]:
        if step.get("name") in LEFT_OUT or "docker/login-action" in step.get("uses", ""):
            continue
        if step.get("id") == "push":
            if "registry=ghcr.io/" not in step["run"]:
                raise Unusable(f"job {name}: its push names no registry=ghcr.io/...")
            steps.append({**step, "run": step["run"].replace("registry=ghcr.io/", f"registry={registry}/")})
            return {**job, "steps": steps, "env": {**job["env"], "TORCHLAB_BUILD_FLAGS": "--provenance=false"}}
        steps.append(step)
    raise Unusable(f"job {name}: no step with id push")


def on_the_engines_buildkit(step):
    """The step with no builder of its own and no GHA cache (GHA_CACHE)."""
    env = step.get("env") or {}
    if "TORCHLAB_BUILDER" not in env:
        return step
    env = {key: value for key, value in env.items() if key != "TORCHLAB_BUILDER"}
    env["TORCHLAB_BUILD_FLAGS"] = " ".join(GHA_CACHE.sub("", env.get("TORCHLAB_BUILD_FLAGS", "")).split())
    return {**step, "env": env}


def container_options(paths):
    """act's --container-options, for the jobs that run in the platform's image, the runner's stand-in, rather than
    a container of their own: the runner's Docker CLI plugins where it has them, and the EXTRA mounts."""
    return " ".join(f"-v {paths[key]}:{MOUNTS[key]}:ro" for key in ("plugins", *EXTRA))


def job_env():
    """act's --env, one a line: this machine's CA for node, as npm, for make's build secret (SSL_CERT_FILE, which
    buildtools/detect-build takes first) and for requests (pip-audit's queries in test_audit.py), where a job's
    image has only the public CAs."""
    names = ("NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
    return "\n".join(f"{name}={MOUNTS['ca']}" for name in names)


def mount_paths(args):
    paths = dict(arg.split("=", 1) for arg in args if "=" in arg)
    if set(paths) != set(MOUNTS):
        raise Unusable(f"give {' '.join(f'{key}=PATH' for key in MOUNTS)}")
    return paths


def main(argv):
    if len(argv) >= 2 and argv[0] == "actions":
        for repo, commit in pinned_actions(Path(p).read_text() for p in argv[1:]):
            print(f"{repo}@{commit}")
        return 0
    if len(argv) >= 3 and argv[0] == "rewrite":
        registry = next((arg.split("=", 1)[1] for arg in argv[3:] if arg.startswith("registry=")), None)
        paths = mount_paths([arg for arg in argv[3:] if not arg.startswith("registry=")])
        workflow = for_this_machine(yaml.safe_load(Path(argv[1]).read_text()), paths, registry)
        Path(argv[2]).write_text(yaml.safe_dump(workflow, sort_keys=False))
        return 0
    if argv == ["env"]:
        print(job_env())
        return 0
    if argv[:1] == ["options"]:
        print(container_options(mount_paths(argv[1:])))
        return 0
    raise Unusable(
        "usage: act_workflow.py actions WORKFLOW... | rewrite WORKFLOW OUT KEY=PATH... | options KEY=PATH... | env"
    )


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (Unusable, OSError, yaml.YAMLError) as error:
        print(f"act_workflow: {error}", file=sys.stderr)
        sys.exit(2)
