# torchlab: `make help` lists the targets. Variables (override on the command line):
IMAGE ?= torchlab## image name
ENV_SOURCE ?= conda## conda (Miniconda + environment.yml) or pypi (Debian base + venv)
BASE_IMAGE ?= python:3.10-slim## base of the pypi path (any Debian image)
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cu118## pip index for torch on the pypi path; empty = PyPI
CA_BUNDLE ?=## CA bundle for builds behind a TLS-intercepting proxy (a BuildKit secret, never in a layer)
DATA ?=## host folder mounted at /data by `make run` (default: generated sample data)
DOCKER ?= docker## docker CLI (needs BuildKit)
COMPOSE ?= docker-compose## compose CLI (docker-compose, or "docker compose")
SHM_SIZE ?= 8g## /dev/shm of `make run`
JUPYTER_HOST_PORT ?= 8888## host port of Jupyter for `make run` (127.0.0.1 only)
SSH_HOST_PORT ?= 2222## host port of sshd for `make run` (127.0.0.1 only)
BENCH_IMAGES ?= 2000## images generated (once, into .cache/bench) for `make bench`
TRAIN_ARGS ?=## train.py flags of `make multinode`, e.g. "--arch resnet18 --epochs 1"

VERSION ?= $(shell cat VERSION)## release version in labels, tags and lock file names (default: the VERSION file)
LOCK ?=## lock file to rebuild a release exactly, e.g. locks/py311-cu124-0.2.0.pypi.txt (default: none)
LOCK_DIR ?= locks## where `make export-env` writes the lock file
REGISTRY ?=## registry prefix for `make push`, e.g. ghcr.io/you

SHELL := /bin/bash
, := ,
VENV := .venv
SAMPLE_DATA := .cache/sample-data
BUILD_ARGS := --build-arg ENV_SOURCE=$(ENV_SOURCE) --build-arg BASE_IMAGE=$(BASE_IMAGE) \
	--build-arg TORCH_INDEX_URL=$(TORCH_INDEX_URL) $(if $(CA_BUNDLE),--secret id=ca_bundle$(,)src=$(CA_BUNDLE)) \
	--build-arg LOCK_FILE=$(LOCK) --build-arg VERSION=$(VERSION) --build-arg REVISION=$(shell git rev-parse HEAD 2>/dev/null || echo unknown) \
	--build-arg SOURCE=$(shell git remote get-url origin 2>/dev/null || echo unknown)

.DEFAULT_GOAL := help
.PHONY: help build base-debian run compose-up compose-down multinode bench tag push shell test test-static test-unit test-image lint export-env clean

help: ## show this help
	@echo "Targets:"
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## (.*)/  \1|\2/' | column -t -s'|'
	@echo "Variables:"
	@grep -E '^[A-Z_]+ \?=.*## ' $(MAKEFILE_LIST) | sed -E 's/^([A-Z_]+) \?= ?(.*)## (.*)/  \1|[\2]|\3/' | column -t -s'|'

build: ## build the image (ENV_SOURCE=conda or pypi)
	DOCKER_BUILDKIT=1 $(DOCKER) build $(BUILD_ARGS) -t $(IMAGE) .

base-debian: ## build torchlab/debian:bookworm from Debian's packages alone (no registry needed)
	rm -rf .cache/bookworm && mkdir -p .cache
	debootstrap --variant=minbase bookworm .cache/bookworm http://deb.debian.org/debian
	tar -C .cache/bookworm -c . | $(DOCKER) import - torchlab/debian:bookworm
	rm -rf .cache/bookworm

$(VENV)/.done: tests/requirements.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -r tests/requirements.txt
	touch $@

$(SAMPLE_DATA)/.done: $(wildcard train/*.py)
	mkdir -p .cache
	$(DOCKER) run --rm --user $$(id -u):$$(id -g) --entrypoint python -v $(CURDIR)/.cache:/cache $(IMAGE) \
		/opt/torchlab/train/sample_data.py /cache/sample-data
	touch $@

run: $(if $(DATA),,$(SAMPLE_DATA)/.done) ## start the container: ports on 127.0.0.1, /data mounted, GPUs if present
	@key=$$(cat ~/.ssh/id_ed25519.pub ~/.ssh/id_rsa.pub 2>/dev/null | head -n1); \
	gpus=$$(command -v nvidia-smi >/dev/null && echo --gpus all); \
	name=torchlab-$${USER:-$$(id -un)}; \
	$(DOCKER) run -d --name $$name $$gpus --shm-size=$(SHM_SIZE) \
		-p 127.0.0.1:$(JUPYTER_HOST_PORT):8888 -p 127.0.0.1:$(SSH_HOST_PORT):2222 \
		-v $(abspath $(or $(DATA),$(SAMPLE_DATA))):/data:ro -v torchlab-workspace:/workspace \
		-v torchlab-ssh-host-keys:/etc/ssh/host_keys -e SSH_PUBLIC_KEY="$$key" $(IMAGE) >/dev/null && \
	for i in $$(seq 120); do \
		$(DOCKER) exec $$name sh -c 'test -e /run/torchlab/services && torchlab-healthcheck' 2>/dev/null && break; \
		sleep 1; \
	done; \
	token=$$($(DOCKER) logs $$name 2>&1 | sed -n 's/.*token=\([0-9a-f]*\).*/\1/p' | head -n1); \
	echo "Jupyter: http://127.0.0.1:$(JUPYTER_HOST_PORT)/tree?token=$$token"; \
	echo "SSH:     ssh -p $(SSH_HOST_PORT) jovyan@127.0.0.1"; \
	echo "Stop:    $(DOCKER) rm -f $$name"

compose-up: $(if $(DATA),,$(SAMPLE_DATA)/.done) ## docker-compose.yml: volumes, secrets, restart policy, GPUs if present
	@mkdir -p .cache && [ -s .cache/jupyter_token ] || \
		(umask 077 && python3 -c 'import secrets; print(secrets.token_hex(24))' > .cache/jupyter_token)
	DATA=$(abspath $(or $(DATA),$(SAMPLE_DATA))) $(COMPOSE) -f docker-compose.yml \
		$$(command -v nvidia-smi >/dev/null && echo -f docker-compose.gpu.yml) up -d
	@echo "Jupyter: http://127.0.0.1:$(JUPYTER_HOST_PORT)/tree?token=$$(cat .cache/jupyter_token)"
	@echo "SSH:     ssh -p $(SSH_HOST_PORT) jovyan@127.0.0.1"

multinode: $(if $(DATA),,$(SAMPLE_DATA)/.done) ## one torchrun job over two containers (docker-compose.multinode.yml)
	DATA=$(abspath $(or $(DATA),$(SAMPLE_DATA))) TORCHLAB_IMAGE=$(IMAGE) TRAIN_ARGS="$(TRAIN_ARGS)" \
		$(COMPOSE) -f docker-compose.multinode.yml up
	$(COMPOSE) -f docker-compose.multinode.yml ps

compose-down: ## stop the compose service (volumes kept)
	$(COMPOSE) -f docker-compose.yml down

bench: ## compare input pipelines (naive, classic, torchlab, prepared) with ceilings; .cache/bench/results/bench.{json,png}
	mkdir -p .cache/bench
	$(DOCKER) run --rm --user $$(id -u):$$(id -g) --shm-size=2g -e HOME=/tmp -e MPLCONFIGDIR=/tmp \
		-v $(CURDIR)/.cache/bench:/cache --entrypoint python $(IMAGE) \
		/opt/torchlab/train/bench.py --images $(BENCH_IMAGES) --cache-dir /cache --out-dir /cache/results

# What is inside the image, e.g. py310-cu118: the start of its tags and lock file names.
INSIDE = $(DOCKER) run --rm --entrypoint python $(IMAGE) -c 'import sys, torch; \
	print("py%d%d-cu%s" % (*sys.version_info[:2], (torch.version.cuda or "cpu").replace(".", "")))'

tag: ## tag the built image with what is inside, e.g. torchlab:py310-cu118-<version>
	@tag=$$($(INSIDE))-$(VERSION) && $(DOCKER) tag $(IMAGE) $(IMAGE):$$tag && echo "$(IMAGE):$$tag"

push: ## push the image as REGISTRY/IMAGE:<what is inside>-<version> and :latest
	@[ -n "$(REGISTRY)" ] || { echo "make push: set REGISTRY, e.g. make push REGISTRY=ghcr.io/you" >&2; exit 2; }
	@tag=$$($(MAKE) -s tag) && tag=$${tag##*:} && \
	for t in $$tag latest; do \
		$(DOCKER) tag $(IMAGE) $(REGISTRY)/$(IMAGE):$$t && $(DOCKER) push $(REGISTRY)/$(IMAGE):$$t || exit 1; \
	done

shell: ## a shell in a throwaway container, as the user
	$(DOCKER) run --rm -it $(IMAGE) bash -l

lint: $(VENV)/.done ## hadolint, shellcheck, ruff
	$(VENV)/bin/hadolint Dockerfile
	$(VENV)/bin/shellcheck entrypoint.sh config/*.sh config/torchlab .ci/run
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint test-static build test-unit test-image ## lint, static checks, build, then every test against the image

test-static: $(VENV)/.done ## checks of the production path that need no build (env pins, Dockerfile)
	$(VENV)/bin/pytest tests/static

test-unit: ## train/ tests, on the CPU, inside the image
	$(DOCKER) run --rm --shm-size=1g -v $(CURDIR):/src:ro -w /src -e PYTHONDONTWRITEBYTECODE=1 $(IMAGE) \
		python -m pytest -p no:cacheprovider tests/unit

test-image: $(VENV)/.done ## tests of the built image with real clients (ssh, HTTP, websocket)
	TORCHLAB_IMAGE=$(IMAGE) DOCKER=$(DOCKER) TORCHLAB_CA_BUNDLE=$(CA_BUNDLE) $(VENV)/bin/pytest -s tests/image

export-env: ## write the built env to LOCK_DIR/<what is inside>-<VERSION>.{conda.yml,pypi.txt}; commit it per release
	@set -o pipefail; tag=$$($(INSIDE))-$(VERSION) && mkdir -p $(LOCK_DIR) && \
	source=$$($(DOCKER) image inspect -f '{{index .Config.Labels "io.torchlab.env-source"}}' $(IMAGE)) && \
	if [ "$$source" = conda ]; then \
		out=$(LOCK_DIR)/$$tag.conda.yml; \
		$(DOCKER) run --rm --entrypoint conda $(IMAGE) env export --name torchlab --no-builds | grep -v '^prefix:' > $$out.tmp; \
	else \
		out=$(LOCK_DIR)/$$tag.pypi.txt; \
		$(DOCKER) run --rm --entrypoint pip $(IMAGE) freeze --all > $$out.tmp; \
	fi && mv $$out.tmp $$out && echo "wrote $$out" || { rm -f $(LOCK_DIR)/*.tmp; exit 1; }

clean: ## remove the image, stopped test containers, the venv and caches
	-$(DOCKER) rm -f $$($(DOCKER) ps -aq --filter label=torchlab.test) 2>/dev/null
	-$(DOCKER) image rm $(IMAGE)
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache
