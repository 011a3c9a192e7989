#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what the tests need when it is
# missing, then formatting, clippy and every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages the tests use, as PROBE:PACKAGE (see ensure-packages.sh):
# promtool and prometheus check every daemon's /metrics and scrape a whole
# fabric; libpmem backs pmem-server's `libpmem` feature; ip (iproute2) builds
# the testbed's network namespaces; sockperf, iperf3 and redis are the floors
# and the peer `testbed bench --quick` measures against; cmake and libclang
# build the verbs bindings of the `rnic` crate, which pmem-client's and
# pmem-server's `verbs` features use (libibverbs itself is loaded at run time
# and not needed here); tshark dissects the RoCEv2
# packets proto emits (proto/tests/roce_interop.rs); shellcheck checks the
# lab's scripts (the lab installs QEMU and builds its guest image itself:
# lab/image.sh); etcd and etcdctl are the control plane's store in its tests
# (each test starts its own member on its own ports), and protoc with the
# well-known .proto files builds the etcd client. Installing runs
# unattended: tshark's package asks whether non-root users may capture, and
# the answer (no) is given beforehand.
export DEBIAN_FRONTEND=noninteractive
if ! command -v tshark >/dev/null 2>&1 && command -v debconf-set-selections >/dev/null 2>&1; then
  sudo=$([[ $(id -u) -eq 0 ]] || echo sudo)
  echo 'wireshark-common wireshark-common/install-setuid boolean false' |
    $sudo debconf-set-selections
fi
scripts/ensure-packages.sh \
  promtool:prometheus \
  prometheus:prometheus \
  /usr/include/libpmem.h:libpmem-dev \
  ip:iproute2 \
  sockperf:sockperf \
  iperf3:iperf3 \
  redis-server:redis-server \
  redis-benchmark:redis-tools \
  cmake:cmake \
  /usr/lib/llvm-14/lib/libclang.so:libclang-dev \
  tshark:tshark \
  shellcheck:shellcheck \
  etcd:etcd-server \
  etcdctl:etcd-client \
  protoc:protobuf-compiler \
  /usr/include/google/protobuf/descriptor.proto:libprotobuf-dev

# scapy builds RoCEv2 packets and computes their ICRC independently of proto
# (proto/tests/roce_interop.rs, proto/tests/scapy_roce.py).
python3 -c 'import scapy.contrib.roce' 2>/dev/null || python3 -m pip install --quiet scapy

export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
# One build from a clean clone: incremental state would only cost disk
# (several GB) and time.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
export PROPTEST_CASES=${PROPTEST_CASES:-256}

# Each step says how long the run has taken so far, so a slow step shows in
# CI's log.
started=$SECONDS
step() {
  local elapsed=$((SECONDS - started))
  printf '== [%d:%02d] %s\n' $((elapsed / 60)) $((elapsed % 60)) "$*"
}

# The optional feature every test pass builds with: the verbs transport of
# pmem-client, pmem-server and testbed (testbed's `verbs` turns on the
# other two's). One feature set for the passes below, selected from the
# whole workspace, means one build of the workspace's tests and binaries: a
# pass with other features or with `-p` would resolve the dependencies'
# features again and rebuild a good part of the tree. The code compiled
# only without it (the errors that say "built without the `verbs`
# feature") is checked by the first clippy pass, not run. pmem-server's
# `libpmem` is left to its own pass at the end: with it, every binary that
# holds pmem-server (testbed runs the daemons from its own binary) needs
# libpmem.so at run time, which the RDMA lab's guests do not have.
features=testbed/verbs

step "cargo fmt --check, shellcheck"
cargo fmt --all -- --check
shellcheck lab/*.sh
step "cargo clippy"
cargo clippy --locked --workspace --all-targets -- -D warnings
# No code depends on one optional feature being on while another is off, so
# one check with all of them covers them all.
cargo clippy --locked -p pmem-server -p pmem-client -p testbed \
  --features "pmem-server/libpmem,$features" --all-targets -- -D warnings
step "cargo doc (no warnings)"
RUSTDOCFLAGS="-D warnings" cargo doc --locked --workspace --no-deps --quiet
RUSTDOCFLAGS="-D warnings" cargo doc --locked -p testbed -p pmem-server --features testbed/verbs \
  --no-deps --quiet
step "cargo test --workspace --features $features (with the RDMA lab)"
# `cargo test --workspace` builds every workspace binary (its packages'
# integration tests run them) before any test runs, and nothing below
# changes the sources: testkit takes the binaries as built
# (testkit::PREBUILT_VAR) instead of running cargo again from every test
# process that starts another package's daemon. With `verbs` on, this
# pass also runs pmem-client's verbs unit tests (no RDMA device needed)
# and testbed's RDMA lab (testbed/tests/lab.rs): QEMU guests whose kernel
# RDMA stack runs the workload through the devices; the lab installs QEMU
# and builds its guest image itself (lab/image.sh), and needs `pmemctl`
# built with `verbs`, which this build makes.
export TESTKIT_PREBUILT_BINARIES=1
cargo test --locked --workspace --features "$features"
step "the device's forwarding, authentication and failover tests again, on the io_uring back end"
# The device runs on epoll by default (a single client is faster through
# it here); io_uring is its opt-in back end and stays tested by the test
# files that drive the device's I/O (the other device tests are about maps,
# owners and RoCE), and by pmem-client's failover tests, which kill servers
# and devices under traffic. (pmem-server's `authentication` comes along: a
# few seconds, no device in it.)
PMEM_FABRIC_IO=uring cargo test --locked --workspace --features "$features" \
  --test forwarding --test authentication --test failover
step "pmem-server's daemon tests again, on libpmem (--features libpmem)"
# The test files that start the daemon through testkit, which gives it
# --persistence $PMEM_SERVER_TEST_PERSISTENCE, and the library's own tests
# (libpmem's mapping among them). The others never map a region through
# libpmem (maps from etcd, the in-process power-loss test): the first pass
# ran them, on the same code. This pass builds pmem-server again, alone and
# with libpmem, so it comes after every pass that uses the workspace's
# binaries.
mapfile -t libpmem_tests < <(grep -l -E 'pmem_server(s|_with|_spec)?\(' pmem-server/tests/*.rs |
  sed -E 's|^.*/([^/]+)\.rs$|--test=\1|')
if ((${#libpmem_tests[@]} == 0)); then
  echo "no pmem-server test file starts the daemon through testkit" >&2
  exit 1
fi
PMEM_IS_PMEM_FORCE=1 PMEM_SERVER_TEST_PERSISTENCE=libpmem \
  cargo test --locked -p pmem-server --features libpmem --lib "${libpmem_tests[@]}"
step "fuzz every parser of untrusted bytes, 20 s per target, two at a time (installs cargo-fuzz)"
scripts/fuzz.sh 20
step "all tests passed"
