"""The deferred `running` report: sent once, never for a job that ended first, never after the result."""
import threading
import time

from worker.tasks import RunningReport


def test_short_job_sends_nothing():
    sent = []
    r = RunningReport(lambda: sent.append(1), delay_s=0.3).start()
    r.finish()
    r._timer.join(5)  # the timer thread has ended (cancelled), so nothing can be sent any more
    assert not r._timer.is_alive() and sent == []


def test_long_job_sends_once_after_the_delay():
    sent, fired = [], threading.Event()
    r = RunningReport(lambda: (sent.append(time.monotonic()), fired.set()), delay_s=0.05).start()
    assert fired.wait(5)  # the timer sent it
    r.now()  # e.g. a progress line later: no second report
    r.finish()
    assert len(sent) == 1


def test_now_sends_at_once_and_the_timer_does_not_repeat_it():
    sent = []
    r = RunningReport(lambda: sent.append(1), delay_s=0.1).start()
    r.now()
    assert sent == [1]
    r._timer.join(5)  # the timer has run out (and found the report sent)
    assert not r._timer.is_alive()
    r.finish()
    assert sent == [1]


def test_finish_waits_for_a_report_in_flight():
    order = []
    started = threading.Event()

    def slow_send():
        started.set()
        time.sleep(0.3)
        order.append("running")

    r = RunningReport(slow_send, delay_s=0.01).start()
    assert started.wait(2)
    r.finish()  # the job's result would be published right after this returns
    order.append("result")
    assert order == ["running", "result"]


def test_heartbeat_publishes_the_current_job_and_touches_its_file(tmp_path, monkeypatch):
    import worker.tasks as tasks
    from worker.contract import HeartbeatEvent, RunningJob

    sent = []
    monkeypatch.setattr(tasks, "publish", lambda app, event: sent.append(event))
    hb = tasks.Heartbeat(app=None, worker="h:w:1", queues=["gpu"], interval_s=60, file=tmp_path / "hb")
    hb.set_job(RunningJob(job_id=7, attempt=2))
    hb.beat()
    assert isinstance(sent[0], HeartbeatEvent) and sent[0].current == RunningJob(job_id=7, attempt=2)
    assert sent[0].queues == ["gpu"] and not sent[0].stopping
    assert float((tmp_path / "hb").read_text()) > 0
    (tmp_path / "hb").unlink()
    hb.stop()  # never started: stop still says goodbye, with no job
    assert sent[-1].stopping and sent[-1].current is None
    assert not (tmp_path / "hb").exists()  # the goodbye does not look like a healthy worker


def test_a_running_heartbeat_stops_and_says_goodbye(monkeypatch):
    # the thread runs, so stop() joins it (an attribute named _stop once shadowed Thread's own and made
    # that join raise, so a worker's graceful shutdown sent no goodbye)
    import threading

    import worker.tasks as tasks

    sent, first = [], threading.Event()
    monkeypatch.setattr(tasks, "publish", lambda app, event: (sent.append(event), first.set()))
    hb = tasks.Heartbeat(app=None, worker="h:w:1", queues=[], interval_s=60)
    hb.start()
    assert first.wait(5)
    hb.stop()
    assert not hb.is_alive()
    assert [e.stopping for e in sent] == [False, True]


def test_a_heartbeat_that_cannot_be_sent_does_not_touch_the_file(tmp_path, monkeypatch):
    import worker.tasks as tasks

    def down(app, event):
        raise ConnectionError("broker away")

    monkeypatch.setattr(tasks, "publish", down)
    hb = tasks.Heartbeat(app=None, worker="h:w:1", queues=[], interval_s=60, file=tmp_path / "hb")
    hb.beat()
    assert not (tmp_path / "hb").exists()


def test_a_job_message_off_the_contract_is_answered_failed_where_it_names_a_job(tmp_path, monkeypatch):
    import worker.tasks as tasks
    from worker.celery_app import RUN_JOB_TASK, make_celery
    from worker.settings import WorkerSettings

    settings = WorkerSettings(data_dir=tmp_path)
    app = make_celery(settings)
    sent = []
    monkeypatch.setattr(tasks, "publish", lambda _app, event: sent.append(event))
    state = tasks.register_tasks(app, settings, worker_name="w")
    try:
        run_job = app.tasks[RUN_JOB_TASK]
        run_job({"job_id": 7, "attempt": "two"})  # a job id, nothing else valid
        run_job({"job_id": 8, "attempt": 3})
        run_job({"job_id": "x"})  # no job to answer for: logged only
        run_job(["not", "a", "dict"])
    finally:
        state["heartbeat"].stop()
    results = [e for e in sent if isinstance(e, tasks.ResultEvent)]  # the heartbeat's goodbye aside
    assert [(e.job_id, e.attempt, e.state) for e in results] == [(7, 1, "failed"), (8, 3, "failed")]
    assert "does not match the contract" in results[0].error


def test_each_attempt_of_a_job_writes_its_artifacts_in_a_folder_of_its_own(tmp_path):
    from worker.settings import WorkerSettings

    settings = WorkerSettings(data_dir=tmp_path)
    first, retry = settings.artifact_dir(7, 1), settings.artifact_dir(7, 2)
    assert first == settings.artifact_root / "job_7"  # where every artifact lived before retries had their own
    assert retry.parent == first and retry != first and settings.artifact_dir(7, 3) != retry
