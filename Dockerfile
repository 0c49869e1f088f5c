# torchlab: a PyTorch workstation with Jupyter Notebook (8888) and OpenSSH (2222).
#
# Two ways to make the Python environment, one sequence of layers after it:
#   ENV_SOURCE=conda (default): Miniconda base + `conda env create` from environment.yml
#   ENV_SOURCE=pypi:            any Debian base's Python + the same pins from PyPI wheels
# and two flavours (buildtools/flavours.tsv): FLAVOUR=compat (default, the brief's: Python 3.10, CUDA 11.8)
# and FLAVOUR=current (Debian 13's Python 3.13, PyPI's newest torch set; the PyPI path alone), each with the
# pins environment.yml gives it.
# A CA bundle for TLS-intercepting proxies comes in as a BuildKit secret (id=ca_bundle)
# and never lands in a layer. See the Makefile for the build command.

ARG ENV_SOURCE=conda
ARG FLAVOUR=compat
# Debian 12 (bookworm), the last Miniconda line on it; Python 3.10 comes from environment.yml.
ARG MINICONDA_IMAGE=continuumio/miniconda3:24.7.1-0
ARG BASE_IMAGE=python:3.10-slim

# ---------------------------------------------------------------- conda env (production)
# The exact tag is in MINICONDA_IMAGE above.
# hadolint ignore=DL3006
FROM ${MINICONDA_IMAGE} AS env-conda
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# LOCK_FILE (e.g. locks/py310-cu118-0.2.0.conda.yml, from `make export-env`) rebuilds a release
# exactly; empty means the pins of environment.yml, with the newest matching dependencies.
ARG LOCK_FILE=
COPY environment.yml buildtools/envspec.py /tmp/torchlab/
COPY locks/ /tmp/torchlab/locks/
# A named env, not the base env; /opt/env points at it so both paths share one prefix.
RUN --mount=type=secret,id=ca_bundle \
    if [ -f /run/secrets/ca_bundle ]; then \
        export CONDA_SSL_VERIFY=/run/secrets/ca_bundle PIP_CERT=/run/secrets/ca_bundle; \
    fi \
 && conda env create --name torchlab --file "/tmp/torchlab/${LOCK_FILE:-environment.yml}" \
 && conda clean --all --yes \
 && ln -s /opt/conda/envs/torchlab /opt/env \
 && /opt/env/bin/python /tmp/torchlab/envspec.py check --cuda 11.8 /tmp/torchlab/environment.yml

# ---------------------------------------------------------------- PyPI env
# The tag is in BASE_IMAGE above.
# hadolint ignore=DL3006
FROM ${BASE_IMAGE} AS env-pypi
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# PyTorch's CUDA 11.8 wheel index; empty means PyPI's default builds.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu118
ARG FLAVOUR
# As in env-conda: a lock file from `make export-env` (locks/*.pypi.txt) pins every dependency.
ARG LOCK_FILE=
COPY environment.yml buildtools/envspec.py /tmp/torchlab/
COPY locks/ /tmp/torchlab/locks/
# The env is the base Python's own prefix (where its pip installs: /usr/local on Debian's Python and on
# python:*-slim), not a venv, as a conda env is none: the user site (PYTHONUSERBASE, /workspace/.local) then
# comes before the image's packages on sys.path, and pip, as the user, installs over a shipped package there
# and uninstalls it again, which pip refuses in a venv for anything outside it (pypa/pip#5176).
# Debian's Python when the base has none, with its headers (torch.compile builds against them), python3-venv
# for the user's own venvs, and pip from Debian's wheel, by name (pip freeze then says pip==, not the wheel's
# path) and run as /opt/env/bin/python (the scripts' shebangs). EXTERNALLY-MANAGED goes: this Python is the
# image's env, and pip, not apt, manages its packages.
# hadolint ignore=DL3008
RUN if ! command -v python3 >/dev/null; then \
        apt-get update \
     && apt-get install -y --no-install-recommends python3 python3-venv python3-dev \
     && rm -rf /var/lib/apt/lists/*; \
    fi \
 && rm -f "$(python3 -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')/EXTERNALLY-MANAGED" \
 && prefix=$(python3 -c 'import sysconfig; print(sysconfig.get_path("data"))') \
 && for name in python python3; do \
        [ -e "$prefix/bin/$name" ] || ln -s "$(command -v python3)" "$prefix/bin/$name"; \
    done \
 && ln -s "$prefix" /opt/env \
 && if ! /opt/env/bin/python -m pip --version >/dev/null 2>&1; then \
        wheel=$(echo /usr/share/python-wheels/pip-*.whl) \
     && PIP_ROOT_USER_ACTION=ignore /opt/env/bin/python "$wheel/pip" install --no-index --no-cache-dir \
            --find-links "$(dirname "$wheel")" pip; \
    fi
RUN --mount=type=secret,id=ca_bundle \
    --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    if [ -f /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
 && export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
 && spec=(/tmp/torchlab/envspec.py) env_file=/tmp/torchlab/environment.yml flavour=(--flavour "$FLAVOUR") \
 && lock=(${LOCK_FILE:+--constraint "/tmp/torchlab/$LOCK_FILE"}) \
 && /opt/env/bin/pip install "${lock[@]}" -r <(python3 "${spec[@]}" requirements "${flavour[@]}" rest "$env_file") \
 && /opt/env/bin/pip install "${lock[@]}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} \
        -r <(python3 "${spec[@]}" requirements "${flavour[@]}" torch "$env_file") \
 && cuda="$(case "$TORCH_INDEX_URL" in */cu118*) echo 11.8;; esac)" \
 && /opt/env/bin/python "${spec[@]}" check "${flavour[@]}" --cuda "$cuda" "$env_file" \
 && /opt/env/bin/pip check

# ---------------------------------------------------------------- the torchlab package
# A wheel of torchlab/ (pyproject.toml), built with the env's Python; the runtime installs it without
# dependencies (the env has them, pinned) and without leaving the sources or the build behind.
# A stage of this file, not an image to pull.
# hadolint ignore=DL3006
FROM env-${ENV_SOURCE} AS package
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# A C compiler and libjpeg-turbo's headers for the region decoder (torchlab_jpeg).
# hadolint ignore=DL3008
RUN --mount=type=secret,id=ca_bundle \
    apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gcc libc6-dev libjpeg62-turbo-dev \
 && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml VERSION LICENSE /tmp/torchlab-src/
COPY torchlab/ /tmp/torchlab-src/torchlab/
RUN --mount=type=secret,id=ca_bundle \
    --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    if [ -f /run/secrets/ca_bundle ]; then export PIP_CERT=/run/secrets/ca_bundle; fi \
 && PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
    /opt/env/bin/pip wheel --no-deps --wheel-dir /wheels /tmp/torchlab-src

# ---------------------------------------------------------------- the labels, readable inside
# What the runtime's OCI labels say, as /opt/torchlab/image.json for processes inside the container, which cannot
# read labels (every run's environment record holds it). A stage of its own, copied in last: a new revision
# rebuilds this one small file, not the code layers.
# hadolint ignore=DL3006
FROM env-${ENV_SOURCE} AS image-facts
ARG ENV_SOURCE
ARG FLAVOUR
ARG VERSION=dev
ARG LOCK_FILE=
ARG REVISION=unknown
ARG SOURCE=unknown
RUN /opt/env/bin/python -I -c \
    'import json, os; keys = ("VERSION", "REVISION", "SOURCE", "FLAVOUR", "ENV_SOURCE", "LOCK_FILE"); \
    json.dump({key.lower(): os.environ.get(key, "") for key in keys}, open("/image.json", "w"))'

# ---------------------------------------------------------------- shared runtime
# A stage of this file, not an image to pull.
# hadolint ignore=DL3006
FROM env-${ENV_SOURCE} AS runtime
ARG ENV_SOURCE
ARG FLAVOUR
# NB_UID and NB_GID are left unset: the entrypoint tells "not given" (adopt /workspace's
# owner) from a value, and defaults them to 1000 and 100.
# No user-writable place here: this ENV is also root's (the healthcheck, docker exec). What users
# install themselves lands on the /workspace volume through the user's environment, which the
# entrypoint builds at the privilege drop (PYTHONUSERBASE, PATH, CONDA_ENVS_PATH, JUPYTER_PATH,
# TORCHLAB_RUNS: image/start/user.sh).
ENV PATH=/opt/env/bin:$PATH \
    TORCHLAB_ENV_SOURCE=${ENV_SOURCE} \
    TORCHLAB_FLAVOUR=${FLAVOUR} \
    NB_USER=jovyan \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1

# Services and the tools people use over SSH; g++ for torch.compile (and pip builds).
# Installing openssh-server makes host keys: they are deleted here and made at first
# start, so no two containers share them. git-lfs is set up in /etc/gitconfig, for every user;
# `vim` is vim-tiny (which names itself vi only).
# pandoc is left out: 187 MB, for nbconvert's LaTeX and reST exports alone (docs/workstation.md).
# The upgrade brings the base's own packages to Debian's security updates at each build (a base tag such as
# Miniconda's is never rebuilt upstream; the weekly rebuilds read no cache, so they take every update).
# hadolint ignore=DL3008
RUN --mount=type=secret,id=ca_bundle \
    apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get upgrade -y \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        openssh-server openssh-sftp-server tini procps iproute2 rsync tmux sudo libnss-wrapper libjpeg62-turbo \
        ca-certificates git less nano g++ \
        curl wget unzip zip vim-tiny htop jq make git-lfs openssh-client fonts-liberation \
 && git lfs install --system \
 && update-alternatives --install /usr/bin/vim vim /usr/bin/vim.tiny 10 \
 && rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_*

# The user: docker-stacks' contract (jovyan, UID 1000, GID 100 `users`).
# `*` rather than the locked `!` password: no password login, yet sshd (without PAM)
# still accepts keys for the account.
# /workspace is group users' to write (setgid, as docker-stacks' fix-permissions leaves the home): any UID
# started with --group-add=users can save there.
# Starts as a user (--user, runAsNonRoot, OpenShift's arbitrary UIDs) need /run/torchlab writable; a
# UID with no passwd entry gets one through nss_wrapper there, never in /etc/passwd. So that nothing
# the user writes can become root, no program keeps its setuid bit but sudo, whose sudoers holds no
# rule (Debian's root and %sudo lines go) but GRANT_SUDO's, added in root starts alone. `ssh host CMD`
# reads /etc/bash.bashrc before its interactive-only guard: the session's environment goes first.
# hadolint ignore=SC2016
RUN useradd --create-home --shell /bin/bash --uid 1000 --gid 100 --password '*' jovyan \
 && mkdir -p /workspace /etc/ssh/host_keys \
        /usr/local/bin/start-notebook.d /usr/local/bin/before-notebook.d \
 && chown 1000:100 /workspace && chmod 2775 /workspace \
 && install -d -m 1777 /run/torchlab \
 && sed -i -E '/^(root|%sudo)[[:space:]]/d' /etc/sudoers \
 && find / -xdev -perm -4000 -type f ! -path /usr/bin/sudo -exec chmod u-s {} + \
 && sed -i '1i [ -n "${TORCHLAB_SESSION_ENV:-}" ] || [ -z "${SSH_CONNECTION:-}" ] || . /etc/profile.d/torchlab.sh' \
        /etc/bash.bashrc \
 && printf 'Defaults secure_path="/opt/env/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"\n' \
        >/etc/sudoers.d/secure-path \
 && chmod 0440 /etc/sudoers.d/secure-path

COPY image/services/sshd_config /etc/ssh/sshd_config
# OpenSSH 9.8 and later (the current flavour's Debian 13) drop a source's connections for a while after failed
# logins. Behind Docker's published ports every client arrives from one address, so a stranger's failed logins would
# lock everyone out, and with keys alone there is nothing to guess: off, where this sshd knows the option.
RUN key=$(mktemp -u) && ssh-keygen -q -t ed25519 -N '' -f "$key" \
 && if /usr/sbin/sshd -T -f /etc/ssh/sshd_config -h "$key" -o PerSourcePenalties=no >/dev/null 2>&1; then \
        printf '%s\n' '# Set at build: one client address behind Docker, keys only (the Dockerfile).' \
            'PerSourcePenalties no' >>/etc/ssh/sshd_config; \
    fi \
 && rm -f "$key" "$key.pub"
COPY image/services/jupyter_server_config.py /etc/jupyter/jupyter_server_config.py
COPY image/services/profile.sh /etc/profile.d/torchlab.sh
COPY image/services/healthcheck.sh /usr/local/bin/torchlab-healthcheck
COPY environment.yml buildtools/envspec.py buildtools/flavours.tsv /opt/torchlab/

# Code last: a code-only change rebuilds from here in seconds. The package goes into the env (the
# `torchlab` command lands in /opt/env/bin); train.py, in the login directory, is its two-line shim.
RUN --mount=type=bind,from=package,source=/wheels,target=/tmp/wheels \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
    /opt/env/bin/pip install --no-deps --no-cache-dir /tmp/wheels/torchlab-*.whl
COPY train.py /opt/torchlab/train.py
COPY README.md LICENSE /opt/torchlab/
COPY docs/ /opt/torchlab/docs/
COPY notebooks/ /opt/torchlab/notebooks/
COPY image/start/ /usr/local/lib/torchlab/start/
COPY entrypoint.sh /usr/local/bin/entrypoint.sh

EXPOSE 8888 2222
# Root's `docker exec` starts here, where the user can write nothing: in /workspace, `python -c` or `-m` would
# import the user's files first. The entrypoint runs a command Docker starts here in /workspace.
WORKDIR /
# Probed every 3 s, as docker-stacks' images are: "healthy" follows the services within seconds.
HEALTHCHECK --interval=3s --timeout=5s --start-period=60s --retries=3 \
    CMD ["/usr/local/bin/torchlab-healthcheck"]
COPY --from=image-facts /image.json /opt/torchlab/image.json
# OCI metadata; the Makefile passes the version and revision from git.
ARG VERSION=dev
ARG LOCK_FILE=
ARG REVISION=unknown
ARG SOURCE=unknown
ARG FLAVOUR
LABEL org.opencontainers.image.title="torchlab" \
      org.opencontainers.image.description="PyTorch workstation: Jupyter Notebook on 8888 and OpenSSH on 2222, as a non-root user" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="BSD-3-Clause AND LicenseRef-NVIDIA-CUDA-EULA" \
      io.torchlab.flavour="${FLAVOUR}" \
      io.torchlab.env-source="${ENV_SOURCE}" \
      io.torchlab.lock-file="${LOCK_FILE}"
# The entrypoint starts as root to set up the user, keys and sshd, then drops to NB_USER
# for Jupyter and for any command given; only sshd's listener keeps root (privilege separated).
# Started as a user (--user), it runs everything, sshd included, as that user. It hands PID 1 to
# `tini -g` itself, with the secrets out of PID 1's environment (image/start/boundary.sh).
ENTRYPOINT ["/usr/local/bin/entrypoint.sh"]
CMD []
