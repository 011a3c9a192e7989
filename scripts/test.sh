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

echo "== cargo fmt --check, shellcheck"
cargo fmt --all -- --check
shellcheck lab/*.sh
echo "== cargo clippy"
cargo clippy --locked --workspace --all-targets -- -D warnings
# The optional features in one check: pmem-server's libpmem mapping and the
# verbs transport of pmem-client, pmem-server and testbed (testbed's `verbs`
# turns on the other two's). No code depends on one being on while another
# is off (what is compiled only without a feature is checked above), so one
# check covers them all, and what they share is checked once.
cargo clippy --locked -p pmem-server -p pmem-client -p testbed \
  --features pmem-server/libpmem,testbed/verbs --all-targets -- -D warnings
echo "== cargo doc (no warnings)"
RUSTDOCFLAGS="-D warnings" cargo doc --locked --workspace --no-deps --quiet
RUSTDOCFLAGS="-D warnings" cargo doc --locked -p testbed -p pmem-server --features testbed/verbs \
  --no-deps --quiet
echo "== cargo test"
# `cargo test --workspace` builds every workspace binary (its packages'
# integration tests run them) before any test runs, and nothing below
# changes the sources: testkit takes the binaries as built
# (testkit::PREBUILT_VAR) instead of running cargo again from every test
# process that starts another package's daemon.
export TESTKIT_PREBUILT_BINARIES=1
cargo test --locked --workspace
echo "== fabric-device's forwarding and authentication tests again, on the io_uring back end"
# The device runs on epoll by default (measured faster here); io_uring is
# its opt-in back end and stays tested by the two test files that drive the
# device's I/O (the other device tests are about maps, owners and RoCE).
# Selected from the whole workspace, as above, they are the binaries
# already built: `-p fabric-device` would resolve the dependencies'
# features for that package alone, and build a good part of the
# dependency tree again. (pmem-server's `authentication` comes along: a few
# seconds, no device in it.)
PMEM_FABRIC_IO=uring cargo test --locked --workspace --test forwarding --test authentication
echo "== pmem-server's daemon tests again, on libpmem (--features libpmem)"
# The test files that start the daemon through testkit, which gives it
# --persistence $PMEM_SERVER_TEST_PERSISTENCE, and the library's own tests
# (libpmem's mapping among them). The others never map a region through
# libpmem (maps from etcd, the in-process power-loss test): the first pass
# ran them, on the same code.
mapfile -t libpmem_tests < <(grep -l -E 'pmem_server(s|_with|_spec)?\(' pmem-server/tests/*.rs |
  sed -E 's|^.*/([^/]+)\.rs$|--test=\1|')
if ((${#libpmem_tests[@]} == 0)); then
  echo "no pmem-server test file starts the daemon through testkit" >&2
  exit 1
fi
PMEM_IS_PMEM_FORCE=1 PMEM_SERVER_TEST_PERSISTENCE=libpmem \
  cargo test --locked -p pmem-server --features libpmem --lib "${libpmem_tests[@]}"
echo "== cargo test -p pmem-client --features verbs (verbs unit tests; no RDMA device needed)"
cargo test --locked -p pmem-client --features verbs --lib verbs
echo "== the RDMA lab: a QEMU guest's kernel RDMA stack runs the workload through the devices"
cargo build --locked -p pmem-client --features verbs --bins
cargo test --locked -p testbed --features verbs --test lab
echo "== fuzz every parser of untrusted bytes, 20 s per target (installs cargo-fuzz)"
scripts/fuzz.sh 20
echo "== all tests passed"
