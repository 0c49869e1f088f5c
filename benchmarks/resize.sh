#!/bin/bash
# benchmarks/resize.py with OpenCV and Pillow-SIMD, in a throwaway container of the image: as root there, with
# nothing of them in the image, Debian's compiler and headers, Pillow-SIMD built from source for the image's
# Pillow release (it replaces PIL, so only on the child's PYTHONPATH) and OpenCV (4.11: built for numpy 1.x and
# 2.x; --no-deps keeps the env's numpy), then the benchmark on the sources of this folder, mounted read-only.
# Results: .cache/bench/results/bench_resize.json, owned by you.
# Usage: benchmarks/resize.sh [IMAGE]  (default torchlab; DOCKER picks the docker CLI, CA_BUNDLE a CA file)
set -euo pipefail
cd "$(dirname "$0")/.."
image=${1:-torchlab}
docker=${DOCKER:-docker}
ca_options=()
if [ -n "${CA_BUNDLE:-}" ]; then
    ca_options=(-v "$(realpath "$CA_BUNDLE"):/tmp/ca.crt:ro" -e PIP_CERT=/tmp/ca.crt)
fi
mkdir -p .cache/bench
# shellcheck disable=SC2016  # the script in single quotes expands in the container
"$docker" run --rm --user 0 -e HOST_OWNER="$(id -u):$(id -g)" -e PYTHONDONTWRITEBYTECODE=1 "${ca_options[@]}" \
    -v "$PWD:/src:ro" -v "$PWD/.cache/bench:/cache" -w /src --entrypoint bash "$image" -c '
    set -euo pipefail
    ca=()
    if [ -f /tmp/ca.crt ]; then ca=(-o Acquire::https::CAInfo=/tmp/ca.crt); fi
    apt-get "${ca[@]}" update -qq
    DEBIAN_FRONTEND=noninteractive apt-get "${ca[@]}" install -y -qq --no-install-recommends \
        gcc libc6-dev libjpeg62-turbo-dev zlib1g-dev >/dev/null
    pillow=$(python -c "import PIL; print(PIL.__version__)")
    pip install -q --no-cache-dir --root-user-action=ignore --target /tmp/simd "pillow-simd==$pillow.*"
    pip install -q --no-cache-dir --root-user-action=ignore --no-deps --target /tmp/cv opencv-python-headless==4.11.0.86
    mkdir -p /cache/results
    PYTHONPATH=/tmp/cv:/src python benchmarks/resize.py --pillow-simd /tmp/simd --out-dir /cache/results
    chown -R "$HOST_OWNER" /cache/results'
