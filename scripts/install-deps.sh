#!/bin/bash
# Installs the Debian packages deepspeed.cpp builds, tests and benchmarks with; a no-op when all
# are present. Needs root (or sudo) only when something is missing.
set -euo pipefail
PACKAGES=(
  g++ cmake make python3
  libtorch-dev          # libtorch 1.13: tensors, autograd, c10d (TCPStore, ProcessGroupGloo)
  libgloo-dev           # ProcessGroupGloo.hpp includes Gloo's headers; libtorch-dev does not pull them
  libopenblas0-openmp   # without it libtorch multiplies with the reference BLAS, ~15x slower
  nlohmann-json3-dev    # ds_config.json
  libcli11-dev          # command lines (dsrun, examples)
  libfmt-dev            # formatting
  libgtest-dev          # tests
  liburing-dev          # io_uring for NVMe offload
  xz-utils              # CI unpacks the libtorch 2.11 headers that the CUDA sources are checked against
  python3-torch         # PyTorch DDP baseline for the benchmarks (and checkpoint interop tests)
  iproute2              # `ip netns` / `ip link` / `tc`: the network-namespace hosts of the multi-node tests
  openssh-server        # tests/launcher/netns.bash: one sshd per network-namespace host (multi-node tests)
  pdsh                  # dsrun --launcher pdsh (tested in tests/launcher/multinode_env.sh)
  openmpi-bin           # dsrun --launcher openmpi (mpirun)
  protobuf-compiler     # tests/support/tfevents_read.py: protoc --python_out of src/monitor/proto/
  python3-protobuf      #   tensorboard_event.proto, the tests' independent event-file reader
  gnuplot-nox           # tools/ds_plot: PNG curves of a csv_monitor folder
)
# With TORCH_DIR (a libtorch 2.x of the user's, docs/gpu.md) Debian's libtorch is not needed, and
# DS_SKIP_DEPS=1 skips this script on a machine that has the libraries by other means.
if [ "${DS_SKIP_DEPS:-0}" = 1 ]; then exit 0; fi
if [ -n "${TORCH_DIR:-}" ]; then
  kept=(); for p in "${PACKAGES[@]}"; do case $p in libtorch-dev|python3-torch) ;; *) kept+=("$p") ;; esac; done
  PACKAGES=("${kept[@]}")
fi
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
echo "install-deps: installing ${missing[*]}"
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
