# torchlab: `make help` lists the targets. Variables (override on the command line). "auto": buildtools/detect-build
# decides, once per make run, and logs each choice in one line ("torchlab build: ..."); any other value wins.
FLAVOUR ?= compat## compat (the brief's: Python 3.10, CUDA 11.8, Maxwell to Hopper) or current (Python 3.13, PyPI's newest torch, CUDA 13, Turing to Blackwell): buildtools/flavours.tsv
IMAGE ?= torchlab$(if $(filter-out compat,$(FLAVOUR)),-$(FLAVOUR))## image name (torchlab-current for FLAVOUR=current)
CONTAINER ?= $(subst :,-,$(notdir $(IMAGE)))-$(shell id -un)## name of the `make run` container
ENV_SOURCE ?= auto## conda (Miniconda + environment.yml), pypi (a Debian base's Python + PyPI wheels); auto: conda where Miniconda and the conda channels can be had
BASE_IMAGE ?= auto## base of the pypi path (any Debian image); auto: python:3.10-slim where a registry answers, else torchlab/debian:bookworm
TORCH_INDEX_URL ?= auto## pip index for torch on the pypi path; empty = PyPI; auto: PyTorch's cu118 index where it answers, else PyPI
CA_BUNDLE ?= auto## CA bundle for builds (a BuildKit secret, never in a layer); empty = none; auto: SSL_CERT_FILE, REQUESTS_CA_BUNDLE, the system's
DATA ?=## host folder mounted at /data by `make run` (default: generated sample data)
DOCKER ?= auto## docker CLI with BuildKit; auto: the first on PATH with buildx, else one with BuildKit built in (before 23.0)
COMPOSE ?= docker-compose## compose CLI (docker-compose, or "docker compose")
SHM_SIZE ?=## /dev/shm of `make run` (default: Docker's 64 MB; train.py's decode threads need none)
STOP_SECONDS ?= 60## how long `make stop` waits for the container to exit (train.py checkpoints on SIGTERM) before killing it
JUPYTER_UI ?= notebook## what `make run`'s Jupyter URL opens: notebook (Notebook 7, /tree) or lab (JupyterLab, /lab)
JUPYTER_HOST_PORT ?= 8888## host port of Jupyter for `make run` (127.0.0.1 only)
SSH_HOST_PORT ?= 2222## host port of sshd for `make run` (127.0.0.1 only)
REPORTS ?=## folder for the test targets' JUnit XML reports (the hosted CI uploads them); empty = none
UNIT_TIMEOUT ?= 1500## seconds before a hung `make test-unit` is stopped, every thread's stack printed (about 630 s here)
IMAGE_TIMEOUT ?= 3000## seconds before a hung `make test-image` is interrupted, its fixtures torn down (1200-1700 s measured on two CPUs)
IMAGE_WORKERS ?= 2## pytest processes of `make test-image`, each taking whole test files (a test's containers, browser and clients keep the CPUs busy: more processes than CPUs gains little)
BENCH_IMAGES ?= 2000## images generated (once, into .cache/bench) for `make bench`
TRAIN_ARGS ?=## train.py flags of `make multinode`, e.g. "--arch resnet18 --epochs 1"

VERSION ?= $(shell cat VERSION)## release version in labels, tags and lock file names (default: the VERSION file)
LOCK ?= auto## lock file to rebuild a release exactly; empty = none; auto: locks/<what will be built>-<VERSION>.* if there
LOCK_DIR ?= locks## where `make export-env` writes the lock file
REGISTRY ?=## registry prefix for `make push`, e.g. ghcr.io/you

SHELL := /bin/bash
, := ,
VENV := .venv
SAMPLE_DATA := .cache/sample-data
# pytest's flag for a JUnit report named $(1) in REPORTS, or nothing.
junit = $(if $(REPORTS),--junitxml=$(abspath $(REPORTS))/$(1).xml)
JUPYTER_UI_PATH = $(if $(filter lab,$(JUPYTER_UI)),lab,tree)

# The automatic values, each resolved the first time a recipe needs it, then kept for the rest of the run.
detect = $(shell $(2) buildtools/detect-build $(1))$(if $(filter 0,$(.SHELLSTATUS)),,$(error buildtools/detect-build $(1) stopped))
DOCKER_CLI = $(eval DOCKER_CLI := $(call detect,docker,DOCKER='$(DOCKER)'))$(DOCKER_CLI)
CA_BUNDLE_FILE = $(eval CA_BUNDLE_FILE := $(call detect,ca-bundle,CA_BUNDLE='$(CA_BUNDLE)'))$(CA_BUNDLE_FILE)
BUILD_ENV = $(eval BUILD_ENV := $(call detect,env,DOCKER='$(DOCKER_CLI)' CA_BUNDLE='$(CA_BUNDLE_FILE)' \
	FLAVOUR='$(FLAVOUR)' ENV_SOURCE='$(ENV_SOURCE)' BASE_IMAGE='$(BASE_IMAGE)' TORCH_INDEX_URL='$(TORCH_INDEX_URL)' LOCK='$(LOCK)' \
	VERSION='$(VERSION)'))$(BUILD_ENV)
build_setting = $(patsubst $(1)=%,%,$(filter $(1)=%,$(BUILD_ENV)))
# "build" when the image is absent or older than a file it is built from, else empty.
IMAGE_BUILD = $(eval IMAGE_BUILD := $(call detect,image,DOCKER='$(DOCKER_CLI)' IMAGE='$(IMAGE)' FLAVOUR='$(FLAVOUR)'))$(IMAGE_BUILD)
# The flavour's Debian, for make base-debian.
DEBIAN_SUITE = $(shell awk -F'\t' '$$1 == "$(FLAVOUR)" { print $$4 }' buildtools/flavours.tsv)

BUILD_ARGS = --build-arg FLAVOUR=$(call build_setting,FLAVOUR) --build-arg ENV_SOURCE=$(call build_setting,ENV_SOURCE) --build-arg BASE_IMAGE=$(call build_setting,BASE_IMAGE) \
	--build-arg TORCH_INDEX_URL=$(call build_setting,TORCH_INDEX_URL) \
	$(if $(CA_BUNDLE_FILE),--secret id=ca_bundle$(,)src=$(CA_BUNDLE_FILE)) --build-arg LOCK_FILE=$(call build_setting,LOCK) \
	--build-arg VERSION=$(VERSION) --build-arg REVISION=$(shell git rev-parse HEAD 2>/dev/null || echo unknown) \
	--build-arg SOURCE=$(shell git remote get-url origin 2>/dev/null || echo unknown)
# `make stop` with the variables of this command line that name the container.
STOP_COMMAND = $(strip make stop $(foreach v,FLAVOUR IMAGE CONTAINER DOCKER,$(if $(filter command line,$(origin $(v))),$(v)=$($(v)))))
# pytest with $(2) in a container of the image ($(1): docker options) on this folder's sources, copied in rather than
# mounted: where Docker is reached through a mounted socket (a CI job container, a dev container) the engine's host
# has no such path. The copy is what a checkout holds: no .git, .venv or .cache.
in_image_with_sources = id=$$($(DOCKER_CLI) create $(1) -w /src -e PYTHONDONTWRITEBYTECODE=1 $(IMAGE) \
		timeout -s ABRT -k 30 $(UNIT_TIMEOUT) python -m pytest -p no:cacheprovider $(2)) && \
	{ tar -c --exclude=./.git --exclude=./.venv --exclude=./.cache --transform 's,^\.,src,' . | $(DOCKER_CLI) cp - $$id:/ && \
	$(DOCKER_CLI) start -a $$id; status=$$?; $(DOCKER_CLI) rm -f $$id >/dev/null; exit $$status; }
# A sub-make for what has to be built first, given what this run has resolved.
SUB_MAKE = $(MAKE) --no-print-directory DOCKER=$(DOCKER_CLI) CA_BUNDLE=$(CA_BUNDLE_FILE)

.DEFAULT_GOAL := help
.PHONY: help build base-debian image run stop compose-up compose-down multinode bench gpu-check tag push shell test test-static test-unit \
	test-image test-smoke lint export-env ci-act clean

# |-separated lines as aligned columns, indented (column -t needs bsdextrautils, absent from a bare Debian).
align_columns = awk -F'|' '{ for (i = 1; i <= NF; i++) { cell[NR, i] = $$i; if (length($$i) > width[i]) width[i] = length($$i) } \
	fields[NR] = NF } END { for (r = 1; r <= NR; r++) { line = " "; for (i = 1; i <= fields[r]; i++) \
	line = line " " (i < fields[r] ? sprintf("%-" width[i] "s", cell[r, i]) : cell[r, i]); print line } }'

help: ## show this help
	@echo "Targets:"
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## (.*)/\1|\2/' | $(align_columns)
	@echo "Variables:"
	@grep -E '^[A-Z_]+ \?=.*## ' $(MAKEFILE_LIST) | sed -E 's/^([A-Z_]+) \?= ?(.*)## (.*)/\1|[\2]|\3/' | $(align_columns)

build: ## build the image of FLAVOUR (ENV_SOURCE=auto, conda or pypi)
	+@$(if $(call build_setting,BUILD_FIRST),$(SUB_MAKE) base-debian)
	DOCKER_BUILDKIT=1 $(DOCKER_CLI) build $(BUILD_ARGS) -t $(IMAGE) .

base-debian: ## build torchlab/debian:<FLAVOUR's Debian: bookworm or trixie> from Debian's packages alone (no registry needed)
	@[ -n "$(DEBIAN_SUITE)" ] || { echo "make base-debian: FLAVOUR=$(FLAVOUR) is not in buildtools/flavours.tsv" >&2; exit 2; }
	rm -rf .cache/$(DEBIAN_SUITE) && mkdir -p .cache
	debootstrap --variant=minbase $(DEBIAN_SUITE) .cache/$(DEBIAN_SUITE) http://deb.debian.org/debian
	tar -C .cache/$(DEBIAN_SUITE) -c . | $(DOCKER_CLI) import - torchlab/debian:$(DEBIAN_SUITE)
	rm -rf .cache/$(DEBIAN_SUITE)

$(VENV)/.done: tests/requirements.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -r tests/requirements.txt
	touch $@

image: ## build the image if it is absent or older than a file it is built from
	+@$(if $(IMAGE_BUILD),$(SUB_MAKE) build)

$(SAMPLE_DATA)/.done: $(wildcard torchlab/tools/sample_data.py) | image
	mkdir -p .cache
	$(DOCKER_CLI) run --rm --user $$(id -u):$$(id -g) --entrypoint torchlab -v $(CURDIR)/.cache:/cache $(IMAGE) \
		sample-data /cache/sample-data
	touch $@

run: image $(if $(DATA),,$(SAMPLE_DATA)/.done) ## build what is missing, start the container (ports on 127.0.0.1, /data, GPUs if present)
	@key=$$(cat ~/.ssh/id_ed25519.pub ~/.ssh/id_rsa.pub 2>/dev/null | head -n1); \
	[ -n "$$key" ] || echo "make run: no ~/.ssh/id_ed25519.pub or id_rsa.pub, so ssh will refuse you: ssh-keygen -t ed25519" >&2; \
	gpus=$$(command -v nvidia-smi >/dev/null && echo --gpus all); \
	name=$(CONTAINER); \
	$(DOCKER_CLI) run -d --name $$name $$gpus $(if $(SHM_SIZE),--shm-size=$(SHM_SIZE)) \
		-p 127.0.0.1:$(JUPYTER_HOST_PORT):8888 -p 127.0.0.1:$(SSH_HOST_PORT):2222 \
		-v $(abspath $(or $(DATA),$(SAMPLE_DATA))):/data:ro -v torchlab-workspace:/workspace \
		-v torchlab-ssh-host-keys:/etc/ssh/host_keys -e SSH_PUBLIC_KEY="$$key" -e JUPYTER_UI=$(JUPYTER_UI) \
		$(IMAGE) >/dev/null && \
	for i in $$(seq 120); do \
		$(DOCKER_CLI) exec $$name sh -c 'test -e /run/torchlab/services && torchlab-healthcheck' 2>/dev/null && break; \
		[ $$i -lt 120 ] || { echo "make run: the services did not answer in 120 s; see $(DOCKER_CLI) logs $$name" >&2; exit 1; }; \
		sleep 1; \
	done; \
	token=$$($(DOCKER_CLI) logs $$name 2>&1 | sed -n 's/.*token=\([0-9a-f]*\).*/\1/p' | head -n1); \
	echo "Jupyter: http://127.0.0.1:$(JUPYTER_HOST_PORT)/$(JUPYTER_UI_PATH)?token=$$token"; \
	echo "TensorBoard: http://127.0.0.1:$(JUPYTER_HOST_PORT)/tensorboard/?token=$$token"; \
	echo "SSH:     ssh -p $(SSH_HOST_PORT) jovyan@127.0.0.1"; \
	echo "Stop:    $(STOP_COMMAND)"

stop: ## stop the `make run` container (a running train.py gets STOP_SECONDS to checkpoint), then remove it; its volumes (/workspace, SSH host keys) stay
	$(DOCKER_CLI) stop -t $(STOP_SECONDS) $(CONTAINER)
	$(DOCKER_CLI) rm $(CONTAINER)

compose-up: image $(if $(DATA),,$(SAMPLE_DATA)/.done) ## docker-compose.yml: volumes, secrets, restart policy, GPUs if present
	@mkdir -p .cache && [ -n "$$JUPYTER_TOKEN_PATH" ] || [ -s .cache/jupyter_token ] || \
		(umask 077 && python3 -c 'import secrets; print(secrets.token_hex(24))' > .cache/jupyter_token)
	DATA=$(abspath $(or $(DATA),$(SAMPLE_DATA))) TORCHLAB_IMAGE=$(IMAGE) $(COMPOSE) -f docker-compose.yml \
		$$(command -v nvidia-smi >/dev/null && echo -f docker-compose.gpu.yml) up -d
	@echo "Jupyter: http://127.0.0.1:$(JUPYTER_HOST_PORT)/$(JUPYTER_UI_PATH)?token=$$(cat $${JUPYTER_TOKEN_PATH:-.cache/jupyter_token})"
	@echo "SSH:     ssh -p $(SSH_HOST_PORT) jovyan@127.0.0.1"

multinode: image $(if $(DATA),,$(SAMPLE_DATA)/.done) ## one torchrun job over two containers (docker-compose.multinode.yml)
	DATA=$(abspath $(or $(DATA),$(SAMPLE_DATA))) TORCHLAB_IMAGE=$(IMAGE) TRAIN_ARGS="$(TRAIN_ARGS)" \
		$(COMPOSE) -f docker-compose.multinode.yml up
	$(COMPOSE) -f docker-compose.multinode.yml ps

compose-down: ## stop the compose service (volumes kept)
	$(COMPOSE) -f docker-compose.yml down

bench: image ## compare input pipelines (naive, classic, torchlab: processes and threads, prepared) with ceilings; .cache/bench/results/bench.{json,png}
	mkdir -p .cache/bench
	$(DOCKER_CLI) run --rm --user $$(id -u):$$(id -g) --shm-size=2g -e HOME=/tmp -e MPLCONFIGDIR=/tmp \
		-v $(CURDIR)/.cache/bench:/cache --entrypoint torchlab $(IMAGE) \
		bench --images $(BENCH_IMAGES) --cache-dir /cache --out-dir /cache/results

gpu-check: image ## on a GPU host, ~10 min, never in CI: loaders and decoders against threads/workers, the model-only ceiling, training as a share of it, --compile, PSNR, streams; .cache/gpu-check/results
	mkdir -p .cache/gpu-check
	$(DOCKER_CLI) run --rm --gpus all --user $$(id -u):$$(id -g) --shm-size=8g -e HOME=/tmp -e MPLCONFIGDIR=/tmp \
		-v $(CURDIR)/.cache/gpu-check:/cache --entrypoint torchlab $(IMAGE) \
		gpu-check --cache-dir /cache --out-dir /cache/results

# What is inside the image, e.g. py310-cu118: the start of its tags and lock file names.
INSIDE = $(DOCKER_CLI) run --rm --entrypoint python $(IMAGE) -c 'import sys, torch; \
	print("py%d%d-cu%s" % (*sys.version_info[:2], (torch.version.cuda or "cpu").replace(".", "")))'

tag: ## tag the built image with what is inside, e.g. torchlab:py310-cu118-<version>
	@tag=$$($(INSIDE))-$(VERSION) && $(DOCKER_CLI) tag $(IMAGE) $(IMAGE):$$tag && echo "$(IMAGE):$$tag"

push: ## push the image as REGISTRY/IMAGE:<what is inside>-<version> and :latest
	@[ -n "$(REGISTRY)" ] || { echo "make push: set REGISTRY, e.g. make push REGISTRY=ghcr.io/you" >&2; exit 2; }
	@tag=$$($(MAKE) -s tag DOCKER=$(DOCKER_CLI)) && tag=$${tag##*:} && \
	for t in $$tag latest; do \
		$(DOCKER_CLI) tag $(IMAGE) $(REGISTRY)/$(IMAGE):$$t && $(DOCKER_CLI) push $(REGISTRY)/$(IMAGE):$$t || exit 1; \
	done

shell: ## a shell in a throwaway container, as the user
	$(DOCKER_CLI) run --rm -it $(IMAGE) bash -l

# The start's parts (image/start/) are checked as entrypoint.sh sources them, where what they share is declared.
lint: $(VENV)/.done ## hadolint, shellcheck, ruff, the workflows against GitHub's schema
	$(VENV)/bin/hadolint Dockerfile
	$(VENV)/bin/shellcheck -x --check-sourced entrypoint.sh image/services/*.sh .ci/run .ci/act buildtools/detect-build benchmarks/*.sh \
		.github/ci/*
	$(VENV)/bin/check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint test-static build test-unit test-image ## lint, static checks, build, then every test against the image

test-static: $(VENV)/.done ## checks that need no build: env pins, Dockerfile, k8s manifests, buildtools/detect-build
	$(VENV)/bin/pytest tests/static $(call junit,static)

test-unit: ## the torchlab package's and benchmarks/ tests, on the CPU, inside the image (on the sources in this folder, copied in)
	$(call in_image_with_sources,--shm-size=1g,tests/unit benchmarks)
	$(call in_image_with_sources,,-m small_shm tests/unit)

test-image: $(VENV)/.done ## tests of the built image with real clients (ssh, HTTP, websocket)
	TORCHLAB_IMAGE=$(IMAGE) DOCKER=$(DOCKER_CLI) TORCHLAB_CA_BUNDLE=$(CA_BUNDLE_FILE) \
		timeout -s INT -k 120 $(IMAGE_TIMEOUT) $(VENV)/bin/pytest -n $(IMAGE_WORKERS) --dist loadfile tests/image $(call junit,image)

# What the image's contents, an ssh login and a Jupyter kernel need: .ci/run's check of the flavours it does not test in full.
SMOKE_TESTS := tests/image/test_container.py tests/image/test_ssh.py tests/image/test_jupyter.py
test-smoke: $(VENV)/.done ## a few of test-image's files: the image's contents, SSH, Jupyter (a few minutes)
	TORCHLAB_IMAGE=$(IMAGE) DOCKER=$(DOCKER_CLI) TORCHLAB_CA_BUNDLE=$(CA_BUNDLE_FILE) \
		timeout -s INT -k 120 $(IMAGE_TIMEOUT) $(VENV)/bin/pytest -s $(SMOKE_TESTS) $(call junit,smoke-$(FLAVOUR))

export-env: ## write the built env (less torchlab itself) to LOCK_DIR/<what is inside>-<VERSION>.{conda.yml,pypi.txt}; commit it per release
	@set -o pipefail; tag=$$($(INSIDE))-$(VERSION) && mkdir -p $(LOCK_DIR) && \
	source=$$($(DOCKER_CLI) image inspect -f '{{index .Config.Labels "io.torchlab.env-source"}}' $(IMAGE)) && \
	if [ "$$source" = conda ]; then \
		out=$(LOCK_DIR)/$$tag.conda.yml; \
		$(DOCKER_CLI) run --rm --entrypoint conda $(IMAGE) env export --name torchlab --no-builds | grep -v -e '^prefix:' -e '^ *- torchlab[=@ ]' > $$out.tmp; \
	else \
		out=$(LOCK_DIR)/$$tag.pypi.txt; \
		$(DOCKER_CLI) run --rm --entrypoint pip $(IMAGE) freeze --all --exclude torchlab > $$out.tmp; \
	fi && mv $$out.tmp $$out && echo "wrote $$out" || { rm -f $(LOCK_DIR)/*.tmp; exit 1; }

ci-act: ## the hosted workflows under act, as far as this machine allows (docs/building.md): the release's schedule with no tag, ci's non-conda leg end to end, the release up to its push into a local registry
	DOCKER=$(DOCKER_CLI) bash .ci/act release-schedule
	DOCKER=$(DOCKER_CLI) bash .ci/act ci
	DOCKER=$(DOCKER_CLI) bash .ci/act release

clean: ## remove the image, stopped test containers, the venv and caches
	-$(DOCKER_CLI) rm -f $$($(DOCKER_CLI) ps -aq --filter label=torchlab.test) 2>/dev/null
	-$(DOCKER_CLI) image rm $(IMAGE)
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache
