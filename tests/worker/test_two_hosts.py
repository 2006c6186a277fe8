"""A worker on another host: the API and Redis in one network namespace, the worker in a second one
joined to it by a veth pair, with its own data dir (no shared disk). A profiled model cell runs on
the worker, its artifacts are uploaded to the API, and they download from the API.

Needs root and iproute2 (`ip netns`), as on the CI machine; the namespaces, addresses
(10.231.<n>.0/24, private to these namespaces) and processes are this test's own and removed after.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REQUIRE_REDIS
from tests.stack import ROOT

PROFILED = {"size": "custom", "d_model": 32, "d_ff": 64, "num_layers": 1, "num_heads": 2, "context_length": 16,
            "batch": 1, "vocab_size": 100, "steps": 1, "warmup": 0, "profile": True}


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check)


@pytest.fixture
def hosts():
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("redis-server"):
        if REQUIRE_REDIS:  # CI: root, iproute2 and redis-server are there
            pytest.fail("the two-host test needs root, iproute2 and redis-server in CI")
        pytest.skip("needs root, iproute2 and redis-server")
    n = random.randint(1, 250)
    tag = f"bl{os.getpid() % 10000}"
    srv, gpu = f"{tag}srv", f"{tag}gpu"
    net = f"10.231.{n}"
    sh("ip", "netns", "add", srv)
    sh("ip", "netns", "add", gpu)
    try:
        sh("ip", "link", "add", f"{tag}a", "type", "veth", "peer", "name", f"{tag}b")
        sh("ip", "link", "set", f"{tag}a", "netns", srv)
        sh("ip", "link", "set", f"{tag}b", "netns", gpu)
        for ns, dev, ip in ((srv, f"{tag}a", f"{net}.1"), (gpu, f"{tag}b", f"{net}.2")):
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ip}/24", "dev", dev)
            sh("ip", "netns", "exec", ns, "ip", "link", "set", dev, "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield {"srv": srv, "gpu": gpu, "srv_ip": f"{net}.1"}
    finally:
        sh("ip", "netns", "del", srv, check=False)
        sh("ip", "netns", "del", gpu, check=False)


def spawn(ns: str, cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", ns, *cmd], cwd=ROOT, env={**os.environ, **env},
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)


def http(ns: str, method: str, url: str, body: dict | None = None) -> tuple[int, bytes]:
    """A request made from inside namespace `ns`."""
    code = ("import json, sys, urllib.request as u\n"
            "req = u.Request(sys.argv[2], method=sys.argv[1], data=sys.argv[3].encode() or None,\n"
            "                headers={'content-type': 'application/json'})\n"
            "try:\n    r = u.urlopen(req, timeout=30); sys.stdout.buffer.write(r.read()); print('\\n', r.status)\n"
            "except u.HTTPError as e:\n    sys.stdout.buffer.write(e.read()); print('\\n', e.code)\n")
    p = sh("ip", "netns", "exec", ns, sys.executable, "-c", code, method, url, json.dumps(body) if body else "",
           check=False)
    if p.returncode != 0:
        return 0, p.stderr.encode()
    payload, _, status = p.stdout.rstrip("\n").rpartition("\n")
    return int(status), payload.encode()


def test_a_worker_on_another_host_runs_a_profiled_cell_and_its_artifacts_reach_the_api(hosts, tmp_path):
    srv, gpu, ip = hosts["srv"], hosts["gpu"], hosts["srv_ip"]
    procs: list[subprocess.Popen] = []
    try:
        procs.append(spawn(srv, ["redis-server", "--bind", ip, "--port", "6379", "--save", "", "--appendonly", "no",
                            "--protected-mode", "no"],
                           {}, tmp_path / "redis.log"))
        api_env = {"BENCHLAB_DATA_DIR": str(tmp_path / "server"), "BENCHLAB_BROKER_URL": f"redis://{ip}:6379/0",
                   "BENCHLAB_HOST": ip, "BENCHLAB_PORT": "8000"}
        procs.append(spawn(srv, [sys.executable, "-m", "backend.cli", "api"], api_env, tmp_path / "api.log"))
        api = f"http://{ip}:8000"
        deadline = time.monotonic() + 60
        while http(gpu, "GET", f"{api}/api/health")[0] != 200:  # reachable from the worker's host
            assert time.monotonic() < deadline, (tmp_path / "api.log").read_text()[-3000:]
            time.sleep(0.5)
        worker_env = {"BENCHLAB_DATA_DIR": str(tmp_path / "gpu-host"), "BENCHLAB_BROKER_URL": f"redis://{ip}:6379/0",
                      "BENCHLAB_API_URL": api}
        procs.append(spawn(gpu, [sys.executable, "-m", "backend.cli", "worker", "--queues", "default"], worker_env,
                           tmp_path / "worker.log"))
        status, body = http(gpu, "POST", f"{api}/api/sweeps", {"suite": "model", "params": PROFILED})
        assert status == 201, body
        sid = json.loads(body)["id"]
        status, body = http(gpu, "GET", f"{api}/api/sweeps/{sid}?wait_s=60")
        assert json.loads(body)["status"] == "done", (body, (tmp_path / "worker.log").read_text()[-3000:])
        row = json.loads(http(gpu, "GET", f"{api}/api/sweeps/{sid}/results")[1])[0]
        assert row["state"] == "done" and row["error"] is None, row
        names = {a["name"] for a in row["artifacts"]}
        assert "trace.json" in names
        status, trace = http(gpu, "GET", f"{api}/api/jobs/{row['job_id']}/artifacts/trace.json")
        assert status == 200 and json.loads(trace)  # a Chrome trace, served by the API
        server_copy = tmp_path / "server" / "artifacts" / f"job_{row['job_id']}" / "trace.json"
        assert server_copy.read_bytes() == trace  # uploaded: the server's disk, not a shared one
        worker_log = (tmp_path / "worker.log").read_text()
        assert f"broker redis://{ip}:6379/0: reachable" in worker_log and f"API {api}: HTTP 200" in worker_log
    finally:
        for p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(p.pid, signal.SIGKILL)
