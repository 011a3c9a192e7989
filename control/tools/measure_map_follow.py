#!/usr/bin/env python3
"""Time from an operator's map change (`pmemctl cluster apply` returning) to
each daemon logging that it runs the new epoch, over 22 changes: one fabric
device and one pmem-server on a real etcd (Debian's etcd-server), on
loopback, with the default topology's ports made free ones.

Build first (`cargo build -p fabric-device -p pmem-server -p pmem-client
--bins`), then run `control/tools/measure_map_follow.py [TARGET_DIR]`
(default: $CARGO_TARGET_DIR or target, debug profile). A report, not a
test: the figures depend on the machine and its load."""
import os, re, shutil, socket, subprocess, sys, tempfile, time, statistics
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T = os.path.join(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "debug")
d = tempfile.mkdtemp(prefix="map-follow-")
def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
cp, pp = port(), port()
url = f"http://127.0.0.1:{cp}"
etcd = subprocess.Popen(["etcd", "--name", "m", "--data-dir", f"{d}/etcd", "--listen-client-urls", url,
    "--advertise-client-urls", url, "--listen-peer-urls", f"http://127.0.0.1:{pp}",
    "--initial-advertise-peer-urls", f"http://127.0.0.1:{pp}", "--initial-cluster", f"m=http://127.0.0.1:{pp}",
    "--unsafe-no-fsync"], stdout=open(f"{d}/etcd.log", "w"), stderr=subprocess.STDOUT)
for _ in range(100):
    if subprocess.run(["etcdctl", f"--endpoints={url}", "endpoint", "health"], capture_output=True).returncode == 0: break
    time.sleep(0.1)
text = open(os.path.join(ROOT, "configs/default.toml")).read()
ports = {}
def sub(m):
    return f'{m.group(1)}:{ports.setdefault(m.group(0), port())}'
text = re.sub(r'(127\.0\.\d+\.\d+):(\d+)', sub, text)
open(f"{d}/t.toml", "w").write(text)
ctl = [f"{T}/pmemctl", "cluster", "--etcd", url, "--pool", "default"]
subprocess.run(ctl[:4] + ["init", "--from", f"{d}/t.toml"], check=True, capture_output=True)
dev = subprocess.Popen([f"{T}/fabric-device", "--etcd", url, "--pool", "default", "--device", "A", "--insecure"],
    stdout=subprocess.PIPE, stderr=open(f"{d}/dev.log", "w"))
srv = subprocess.Popen([f"{T}/pmem-server", "--etcd", url, "--pool", "default", "--server", "A", "--insecure",
    "--data-dir", f"{d}/data"], stdout=subprocess.PIPE, stderr=open(f"{d}/srv.log", "w"))
dev.stdout.readline(); srv.stdout.readline()
def wait(log, epoch):
    needle = f"map epoch={epoch} applied"
    while needle not in open(log).read(): time.sleep(0.002)
res = {"device": [], "server": []}
for i in range(2, 24):
    open(f"{d}/n.toml", "w").write(text.replace("[pool]\n", f"[pool]\n# change {i}\n"))
    subprocess.run(ctl + ["apply", "--from", f"{d}/n.toml", "--epoch", str(i - 1)], check=True, capture_output=True)
    t0 = time.monotonic()
    for name, log in (("device", f"{d}/dev.log"), ("server", f"{d}/srv.log")):
        wait(log, i); res[name].append((time.monotonic() - t0) * 1000)
for name, v in res.items():
    print(f"{name}: {len(v)} changes, p50 {statistics.median(v):.1f} ms, max {max(v):.1f} ms")
for p in (dev, srv, etcd): p.terminate()
for p in (dev, srv, etcd): p.wait()
shutil.rmtree(d, ignore_errors=True)
