"""The `benchlab` CLI: run (no server), submit --wait against a server, import; and an API restart."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.stack import ROOT, Stack


def benchlab(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "backend.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = Stack(tmp_path_factory.mktemp("cli")).start()
    yield s
    s.stop()


def test_run_writes_importable_results_and_prints_a_table(tmp_path):
    out = tmp_path / "r.jsonl"
    env = {"BENCHLAB_DATA_DIR": str(tmp_path / "data")}
    p = benchlab("run", "noop", "-p", "x=1,2,3", "--out", str(out), env=env)
    assert p.returncode == 0, p.stderr
    assert "noop: 3 cells" in p.stdout
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[0]["kind"] == "sweep" and [x["metrics"]["value"] for x in lines[1:]] == [2.0, 4.0, 6.0]
    assert all(x["env"]["torch"] for x in lines[1:])
    imp = benchlab("import", str(out), "--name", "imported", env=env)
    assert imp.returncode == 0, imp.stderr
    first = json.loads(imp.stdout)
    assert first["jobs"] == 3
    again = benchlab("import", str(out), env=env)  # the same run a second time adds nothing
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"id": first["id"], "jobs": 0, "already_imported": True}
    assert f"imported already, as sweep {first['id']}" in again.stderr
    lines[0].pop("uid")  # a file written before runs had ids imports as a new sweep
    old = tmp_path / "old.jsonl"
    old.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert json.loads(benchlab("import", str(old), env=env).stdout)["id"] != first["id"]


def test_run_takes_repeats_in_rounds_and_lists_each_cells_runs_together(tmp_path):
    out = tmp_path / "r.jsonl"
    p = benchlab("run", "noop", "-p", "x=1,2", "--repeats", "2", "--out", str(out),
                 env={"BENCHLAB_DATA_DIR": str(tmp_path / "data")})
    assert p.returncode == 0, p.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()[1:]]
    assert [(r["cell"], r["repeat"]) for r in rows] == [(0, 0), (1, 0), (0, 1), (1, 1)]  # as they ran
    assert all(rows[i]["finished_at"] <= rows[i + 1]["started_at"] for i in range(3))
    assert "noop: 4 runs" in p.stdout and "repeat" in p.stdout
    table = [line for line in p.stdout.splitlines() if line.startswith("│")]
    assert [[x.strip() for x in line.split("│")[1:3]] for line in table] == [["0", "0"], ["0", "1"],
                                                                            ["1", "0"], ["1", "1"]]


def test_run_exits_non_zero_when_a_cell_fails(tmp_path):
    p = benchlab("run", "noop", "-p", "mode=ok,raise", env={"BENCHLAB_DATA_DIR": str(tmp_path)})
    assert p.returncode == 1
    assert "failed" in p.stdout


def test_run_records_a_cell_past_the_runner_memory_limit_as_oom(tmp_path):
    out = tmp_path / "r.jsonl"
    p = benchlab("run", "noop", "-p", "hold_mb=0,1024", "-p", "sleep_ms=10000", "--out", str(out),
                 env={"BENCHLAB_DATA_DIR": str(tmp_path / "data"), "BENCHLAB_RUNNER_MEMORY_GB": "0.8"})
    assert p.returncode == 1, p.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()[1:]]
    assert [r["state"] for r in rows] == ["done", "oom"]
    assert "past the runner's limit of 0.8 GB (BENCHLAB_RUNNER_MEMORY_GB)" in rows[1]["error"]


def test_run_rejects_bad_params_before_running(tmp_path):
    p = benchlab("run", "attention", "-p", "seq_len=-4", env={"BENCHLAB_DATA_DIR": str(tmp_path)})
    assert p.returncode == 2 and "seq_len" in p.stderr


def test_run_a_spec_file_with_a_list_of_grids_and_import_it(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("suite: noop\nname: two grids\nparams:\n- {x: [1, 2]}\n- {x: 3, mode: ok}\n")
    out = tmp_path / "r.jsonl"
    env = {"BENCHLAB_DATA_DIR": str(tmp_path / "data")}
    p = benchlab("run", "--spec", str(spec), "--out", str(out), env=env)
    assert p.returncode == 0, p.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines[0]["params"] == [{"x": [1, 2]}, {"x": 3, "mode": "ok"}] and lines[0]["name"] == "two grids"
    assert [x["params"]["x"] for x in lines[1:]] == [1, 2, 3]
    imp = benchlab("import", str(out), env=env)
    assert imp.returncode == 0, imp.stderr
    assert json.loads(imp.stdout)["jobs"] == 3


def test_a_spec_that_does_not_parse_is_named_not_a_traceback(tmp_path):
    bad_yaml, bad_json = tmp_path / "s.yaml", tmp_path / "s.json"
    bad_yaml.write_text("suite: [\n")
    bad_json.write_text('{"suite":')
    env = {"BENCHLAB_DATA_DIR": str(tmp_path)}
    for args in (("run", "--spec", str(bad_yaml)), ("submit", str(bad_yaml), "--server", "http://127.0.0.1:9"),
                 ("ci", str(bad_json), "--server", "http://127.0.0.1:9")):
        p = benchlab(*args, env=env)
        assert p.returncode == 2, (args, p.stderr)
        assert "is not a readable" in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)


def test_a_spec_with_nan_or_infinity_is_named_before_anything_is_sent(tmp_path):
    nan_yaml, inf_json = tmp_path / "s.yaml", tmp_path / "s.json"
    nan_yaml.write_text("suite: noop\nparams:\n  x: .nan\n")  # YAML's NaN
    inf_json.write_text('{"suite": "noop", "params": [{"x": 1}, {"sleep_ms": [1, -Infinity]}]}')
    env = {"BENCHLAB_DATA_DIR": str(tmp_path)}
    for args, where in ((("submit", str(nan_yaml), "--server", "http://127.0.0.1:9"), "params.x"),
                        (("ci", str(inf_json), "--server", "http://127.0.0.1:9"), "params[1].sleep_ms[1]"),
                        (("run", "--spec", str(inf_json)), "params[1].sleep_ms[1]")):
        p = benchlab(*args, env=env)
        assert p.returncode == 2, (args, p.stderr)
        assert f"{where} is not a finite number" in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
    assert not (tmp_path / "benchlab.db").exists()  # nothing ran or was stored


def test_files_that_cannot_be_read_or_written_are_named(tmp_path):
    env = {"BENCHLAB_DATA_DIR": str(tmp_path / "data")}
    binary = tmp_path / "b.jsonl"
    binary.write_bytes(b"\xff\xfe\n")
    for args in (("import", str(binary)), ("db", "import", str(binary))):
        p = benchlab(*args, env=env)
        assert p.returncode == 2 and "is not JSON lines" in p.stderr and "Traceback" not in p.stderr, p.stderr
    (tmp_path / "ro").mkdir()
    target = tmp_path / "ro" / "missing" / "x.jsonl"
    p = benchlab("db", "export", str(target), env=env)
    assert p.returncode == 2 and "cannot write" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_run_wants_one_of_suite_spec_or_preset(tmp_path):
    env = {"BENCHLAB_DATA_DIR": str(tmp_path)}
    both = benchlab("run", "noop", "--preset", "ddp-course-cpu", env=env)
    assert both.returncode == 2 and "give SUITE" in both.stderr
    unknown = benchlab("run", "--preset", "nope", env=env)
    assert unknown.returncode == 2 and "no preset 'nope'" in unknown.stderr


def test_import_rejects_a_file_that_is_not_a_run(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text('{"hello": 1}\n')
    p = benchlab("import", str(f), env={"BENCHLAB_DATA_DIR": str(tmp_path)})
    assert p.returncode == 2 and "not a benchlab run file" in p.stderr


def test_submit_wait_succeeds_and_fails_by_cell_state(stack, tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"suite": "noop", "params": {"x": [1, 2]}}))
    p = benchlab("submit", str(good), "--server", stack.url, "--wait", "--poll-s", "0.2")
    assert p.returncode == 0, p.stdout + p.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("suite: noop\nparams:\n  mode: [ok, raise]\n")
    p = benchlab("submit", str(bad), "--server", stack.url, "--wait", "--poll-s", "0.2")
    assert p.returncode == 1, p.stdout + p.stderr
    p = benchlab("submit", str(good), "--server", stack.url.replace(str(stack.port), "1"))
    assert p.returncode == 2 and "cannot reach" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_a_refused_submit_names_each_bad_field_in_words(stack, tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("suite: attention\nparams:\n  seq_len: [-1]\n  impl: nope\n")
    p = benchlab("submit", str(spec), "--server", stack.url)
    assert p.returncode == 2, p.stdout + p.stderr
    err = " ".join(p.stderr.split())  # rich folds long lines
    assert "rejected (422)" in err and "body parameter 'params.seq_len': Input should be greater than 0 (got -1)" in err
    assert "body parameter 'params.impl'" in err and "(got 'nope')" in err and '{"detail"' not in err


def test_api_restart_keeps_sweeps_and_results(stack):
    sweep = stack.submit({"suite": "noop", "params": {"x": [5, 6]}})
    stack.wait(sweep["id"])
    before = stack.results(sweep["id"])
    stack.stop_api()
    stack.start_api()
    assert stack.results(sweep["id"]) == before
    # and the restarted API still records new work
    again = stack.submit({"suite": "noop", "params": {"x": 7}})
    assert stack.wait(again["id"])["counts"]["done"] == 1


def test_up_serves_and_stops_both_halves_on_ctrl_c(tmp_path):
    import signal
    import time

    import httpx

    from tests.stack import free_port

    port = free_port()
    env = {**os.environ, "BENCHLAB_DATA_DIR": str(tmp_path), "BENCHLAB_PORT": str(port)}
    proc = subprocess.Popen([sys.executable, "-m", "backend.cli", "up"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        sid = None
        while time.monotonic() < deadline:
            try:
                r = httpx.post(f"http://127.0.0.1:{port}/api/sweeps", json={"suite": "noop", "params": {"x": 1}})
                sid = r.json()["id"]
                break
            except httpx.HTTPError:
                time.sleep(0.3)
        assert sid is not None, "benchlab up did not serve"
        while httpx.get(f"http://127.0.0.1:{port}/api/sweeps/{sid}").json()["status"] != "done":
            assert time.monotonic() < deadline, "the embedded worker did not run the job"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    import re
    from pathlib import Path

    output = proc.stdout.read()
    m = re.search(r"worker pid (\d+)", output)
    assert m, output
    worker_pid = int(m.group(1))
    deadline = time.monotonic() + 20
    while Path(f"/proc/{worker_pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(f"/proc/{worker_pid}").exists(), "the embedded worker outlived benchlab up"


def test_compare_judges_a_known_slowdown_and_exits_by_verdict(stack, tmp_path):
    def sweep(work_ms, seed):
        body = {"suite": "noop", "params": {"work_ms": work_ms, "noise": 0.02, "seed": seed, "repeats": 15,
                                            "x": [1, 2]}}
        sid = stack.submit(body)["id"]
        stack.wait(sid)
        return sid

    base, same, slow = sweep(20, 1), sweep(20, 2), sweep(26, 3)
    p = benchlab("compare", str(base), str(same), "--server", stack.url)
    assert p.returncode == 2 and "--ignore" in p.stderr  # the seeds differ: no cell matches as given
    p = benchlab("compare", str(base), str(same), "--server", stack.url, "--ignore", "seed",
                 "--json", str(tmp_path / "c.json"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads((tmp_path / "c.json").read_text())["summary"]["slower"] == 0
    p = benchlab("compare", str(base), str(slow), "--server", stack.url, "--ignore", "seed,work_ms",
                 "--markdown", str(tmp_path / "c.md"))
    assert p.returncode == 1, p.stdout + p.stderr
    assert (tmp_path / "c.md").read_text().count("| slower |") == 2  # both cells, a 30 % slowdown
    p = benchlab("compare", str(base), "999999", "--server", stack.url)
    assert p.returncode == 2 and "404" in p.stderr
    p = benchlab("compare", str(base), str(same), "--server", stack.url, "--ignore", "seed,sede")
    assert p.returncode == 2 and "'sede'" in p.stderr and "seed" in p.stderr  # a typo is named, not matched on


def test_ci_judges_a_sweep_against_its_baseline_with_exit_codes(stack, tmp_path):
    def spec(name, work_ms, mode="ok"):
        p = tmp_path / f"{name}.yaml"
        p.write_text(f"suite: noop\nparams:\n  work_ms: {work_ms}\n  noise: 0.02\n  repeats: 15\n  mode: {mode}\n"
                     f"  x: [1, 2]\nqueue: {stack.queue}\n")
        return str(p)

    env = {"GITHUB_REF_NAME": "main", "GITHUB_SHA": "c0ffee"}
    first = benchlab("ci", spec("a", 20), "--server", stack.url, env=env)
    assert first.returncode == 2 and "can be the next baseline" in first.stderr, first.stdout + first.stderr
    same = benchlab("ci", spec("a", 20), "--server", stack.url, "--json", str(tmp_path / "same.json"), env=env)
    assert same.returncode == 0, same.stdout + same.stderr
    judged = json.loads((tmp_path / "same.json").read_text())
    assert judged["summary"]["slower"] == 0 and len(judged["cells"]) == 2
    sweep = stack.client.get(f"/api/sweeps/{judged['sweep']}").json()
    assert sweep["tags"]["branch"] == "main" and sweep["tags"]["commit"] == "c0ffee"
    slow = benchlab("ci", spec("b", 26), "--server", stack.url, "--ignore", "work_ms",
                    "--markdown", str(tmp_path / "slow.md"), env=env)
    assert slow.returncode == 1, slow.stdout + slow.stderr
    assert (tmp_path / "slow.md").read_text().count("| slower |") == 2
    confirmed = benchlab("ci", spec("b", 26), "--server", stack.url, "--ignore", "work_ms", "--confirm",
                         "--baseline", str(judged["sweep"]),
                         "--json", str(tmp_path / "confirmed.json"), env=env)
    assert confirmed.returncode == 1, confirmed.stdout + confirmed.stderr
    result = json.loads((tmp_path / "confirmed.json").read_text())
    assert [c["confirmed"] for c in result["cells"]] == [True, True]
    again = result["confirmation"]
    # the baseline's configuration (work_ms 20) differs only in an ignored param: it ran again beside
    assert again["baseline"] != result["baseline"] and again["sweep"] > result["sweep"]
    rerun = stack.client.get(f"/api/sweeps/{again['baseline']}/results").json()
    assert {r["params"]["work_ms"] for r in rerun} == {20.0}
    assert stack.client.get(f"/api/sweeps/{again['sweep']}").json()["tags"]["confirms"] == str(result["sweep"])
    failing = benchlab("ci", spec("c", 20, mode="raise"), "--server", stack.url, env=env)
    assert failing.returncode == 2 and "cannot judge" in failing.stderr
    away = benchlab("ci", spec("a", 20), "--server", stack.url.replace(str(stack.port), "1"), env=env)
    assert away.returncode == 2 and "cannot reach" in away.stderr
    # a baseline named by id is checked before anything is submitted: there, and of the spec's suite
    before = len(stack.client.get("/api/sweeps", params={"limit": 1000}).json())
    other = tmp_path / "attention.yaml"
    other.write_text(f"suite: attention\nparams: {{impl: naive}}\nqueue: {stack.queue}\n")
    for args, words in (((spec("a", 20), "--baseline", "999999"), "cannot use baseline 999999 (404)"),
                        ((spec("a", 20), "--baseline", "latest"), "--baseline is auto or a sweep id"),
                        ((str(other), "--baseline", str(judged["sweep"])), "ran the noop suite")):
        p = benchlab("ci", *args, "--server", stack.url, env=env)
        assert p.returncode == 2 and words in p.stderr, p.stderr
    assert len(stack.client.get("/api/sweeps", params={"limit": 1000}).json()) == before


def test_ci_tags_and_baseline_choice():
    from backend.ci import ci_tags, find_baseline

    assert ci_tags({"GITHUB_SHA": "abc", "GITHUB_REF_NAME": "main", "CI_COMMIT_SHA": "zzz", "RUNNER_NAME": ""}) == \
        {"commit": "abc", "branch": "main"}
    sweeps = [{"id": 1, "suite": "noop", "status": "done", "params": {"x": 1}, "tags": {"branch": "main"}},
              {"id": 2, "suite": "noop", "status": "done", "params": {"x": 1}, "tags": {"branch": "dev"}},
              {"id": 3, "suite": "noop", "status": "running", "params": {"x": 1}, "tags": {"branch": "main"}},
              {"id": 4, "suite": "noop", "status": "done", "params": {"x": 2}, "tags": {"branch": "main"}}]
    assert find_baseline(sweeps, "noop", {"x": 1})["id"] == 1
    assert find_baseline(sweeps, "noop", {"x": 3}, ignore=["x"])["id"] == 4  # the newest, x ignored
    assert find_baseline(sweeps, "noop", {"x": 1}, branch="dev")["id"] == 2
    assert find_baseline(sweeps, "attention", {"x": 1}) is None


def test_plan_prints_the_api_plan_and_refuses_bad_input_by_name(tmp_path):
    env = {"BENCHLAB_DATA_DIR": str(tmp_path)}
    p = benchlab("plan", "--size", "small", "--devices", "4", "--out", str(tmp_path / "plan.json"), env=env)
    assert p.returncode == 0, p.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["cluster"]["devices"] == 4 and plan["model"]["d_model"] == 768
    assert [s["strategy"] for s in plan["strategies"]] == ["dp", "fsdp", "tp"]
    assert plan["sources"]["flops"].startswith("H200 datasheet") and plan["measured"] == []  # an empty database
    for args, words in ((["--size", "huge"], "unknown size 'huge'"),
                        (["--size", "custom", "--d-model", "64"], "size=custom needs d_model"),
                        (["--tflops", "-1"], "--tflops: Input should be greater than 0 (got -1.0)"),
                        (["--memory-gb", "inf"], "--memory-gb: Input should be a finite number"),
                        (["--devices", "100000"], "--devices: Input should be less than or equal to 65536"),
                        (["--size", "custom", "--d-model", "64", "--d-ff", "1", "--num-layers", "1",
                          "--num-heads", "3"], "--num-heads: Value error, num_heads (3) must divide d_model (64)")):
        bad = benchlab("plan", *args, env=env)
        assert bad.returncode == 2 and words in bad.stderr, (args, bad.stderr)


def test_a_server_that_is_not_benchlab_is_named_as_such(tmp_path):
    import time

    import httpx

    from tests.stack import free_port

    port = free_port()
    other = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(f"http://127.0.0.1:{port}/")
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        p = benchlab("compare", "1", "2", "--server", f"http://127.0.0.1:{port}",
                     env={"BENCHLAB_DATA_DIR": str(tmp_path)})
        assert p.returncode == 2
        assert f"is http://127.0.0.1:{port} a benchlab server?" in p.stderr and "<html" not in p.stderr.lower()[:80]
    finally:
        other.terminate()
        other.wait(10)


@pytest.mark.parametrize("command, setting, words", [
    (("api",), {"BENCHLAB_PORT": "abc"}, "bad setting: BENCHLAB_PORT: Input should be a valid integer"),
    (("api",), {"BENCHLAB_MAX_BODY_KB": "0"}, "bad setting: BENCHLAB_MAX_BODY_KB: Input should be greater than or "
                                              "equal to 1"),
    (("worker",), {"BENCHLAB_JOB_TIMEOUT_S": "inf"}, "bad setting: BENCHLAB_JOB_TIMEOUT_S: Input should be a finite "
                                                     "number"),
    (("worker",), {"BENCHLAB_HEARTBEAT_S": "0"}, "bad setting: BENCHLAB_HEARTBEAT_S: Input should be greater than 0"),
    (("db", "upgrade"), {"BENCHLAB_DATABASE_URL": "nosuch://x"}, "database error (BENCHLAB_DATABASE_URL): Can't load "
                                                                 "plugin"),
    (("api",), {"BENCHLAB_DATABASE_URL": "not a url"}, "database error (BENCHLAB_DATABASE_URL): Could not parse")])
def test_a_bad_setting_or_database_url_is_one_line_naming_it_not_a_traceback(tmp_path, command, setting, words):
    # each process checks the settings it reads (a worker never opens the database)
    p = benchlab(*command, env={"BENCHLAB_DATA_DIR": str(tmp_path), **setting}, timeout=60)
    assert p.returncode == 2, p.stderr[-2000:]
    assert words in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]


def test_run_refuses_a_param_given_twice_and_an_out_it_cannot_write_before_any_cell_runs(tmp_path):
    env = {"BENCHLAB_DATA_DIR": str(tmp_path / "data")}
    p = benchlab("run", "noop", "-p", "x=1", "-p", "x=2", "--out", str(tmp_path / "r.jsonl"), env=env)
    assert p.returncode == 2 and "-p x given more than once" in p.stderr and "-p x=1,2" in p.stderr, p.stderr
    for out in (tmp_path, tmp_path / "r.jsonl" / "under-a-file.jsonl"):  # a folder; a file where a folder goes
        (tmp_path / "r.jsonl").write_text("")
        p = benchlab("run", "noop", "-p", "x=1", "--out", str(out), env=env)
        assert p.returncode == 2 and f"cannot write {out}" in p.stderr and "Traceback" not in p.stderr, p.stderr
    p = benchlab("run", "--preset", "ddp-course-cpu", "--out", str(tmp_path / "r.jsonl"), env=env)
    assert p.returncode == 2 and "writes a file per sweep into the folder" in p.stderr, p.stderr
    assert not (tmp_path / "data" / "artifacts").exists()  # no cell ran


def test_db_export_of_a_sweep_that_is_not_there_writes_nothing(tmp_path):
    env = {"BENCHLAB_DATA_DIR": str(tmp_path)}
    out = tmp_path / "e.jsonl"
    p = benchlab("db", "export", str(out), "--sweep", "999", env=env)
    assert p.returncode == 2 and "no sweep 999 in this database" in p.stderr and not out.exists(), p.stderr


@pytest.mark.parametrize("args, option", [
    (("run", "noop", "-p", "x=1", "--timeout-s", "0"), "--timeout-s"),
    (("run", "noop", "-p", "x=1", "--timeout-s", "nan"), "--timeout-s"),
    (("submit", "SPEC", "--wait", "--poll-s", "-1", "--server", "http://127.0.0.1:9"), "--poll-s"),
    (("ci", "SPEC", "--timeout-s", "inf", "--server", "http://127.0.0.1:9"), "--timeout-s"),
    (("compare", "1", "2", "--threshold", "1.5", "--server", "http://127.0.0.1:9"), "--threshold"),
    (("ci", "SPEC", "--threshold", "0", "--server", "http://127.0.0.1:9"), "--threshold"),
    (("api", "--port", "99999"), "--port"), (("up", "--port", "0"), "--port")])
def test_durations_and_thresholds_out_of_range_are_refused_before_anything_runs(tmp_path, args, option):
    spec = tmp_path / "s.yaml"
    spec.write_text("suite: noop\nparams: {x: 1}\n")
    p = benchlab(*(str(spec) if a == "SPEC" else a for a in args), env={"BENCHLAB_DATA_DIR": str(tmp_path)})
    assert p.returncode == 2 and f"Invalid value for '{option}'" in p.stderr, p.stderr
    assert "cannot reach" not in p.stderr and "timeout" not in p.stdout  # refused before any request or cell


@pytest.mark.parametrize("queues, words", [("results", "queue 'results' is reserved"),
                                           ("gpu,celery", "queue 'celery' is reserved"),
                                           ("a b", "'a b': queue names are"), (" , ", "give at least one")])
def test_a_worker_refuses_queues_it_must_not_consume(tmp_path, queues, words):
    # a worker on `results` would take the recorder's messages and drop them as unknown tasks
    p = benchlab("worker", "--queues", queues, env={"BENCHLAB_DATA_DIR": str(tmp_path)}, timeout=60)
    assert p.returncode == 2 and words in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]


def test_up_and_api_name_an_address_in_use_before_starting_anything(tmp_path):
    import socket

    from tests.stack import free_port

    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        for command in ("up", "api"):
            p = benchlab(command, "--port", str(port), env={"BENCHLAB_DATA_DIR": str(tmp_path)}, timeout=60)
            assert p.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in p.stderr, p.stderr[-2000:]
            assert "dashboard on" not in p.stderr  # `up` started no worker and promised no dashboard
