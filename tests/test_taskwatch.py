import logging
import threading
import time

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from exporter.poll.dispatch import ON_TIME_AGAIN
from exporter.poll.taskwatch import TaskWatch
from exporter.serve.app import App, status_json
from exporter.serve.state import State, TaskStats

from test_app import call
from test_collector import exposition


def behind_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "exporter.poll.taskwatch"]


def test_a_task_that_misses_runs_is_counted_and_said_once_as_it_falls_behind_and_once_as_it_keeps_up(caplog):
    caplog.set_level(logging.INFO, logger="exporter.poll.taskwatch")
    changes = []
    watch = TaskWatch(changed=lambda: changes.append(1))
    watch.expect("read", 15.0)
    assert watch.stats() == {"read": TaskStats(15.0)}

    watch.started("read", 40.0)
    watch.missed("read", 55.0)  # the first read reaches 5 minutes back: counted, not falling behind
    watch.ended("read", 62.0)
    assert watch.stats()["read"] == TaskStats(15.0, runs=1, missed=1, last_seconds=22.0, behind=False)
    assert behind_lines(caplog) == []
    watch.started("read", 100.0)
    watch.missed("read", 115.0)  # a 10,000-pod read still runs when the next one is due
    watch.missed("read", 130.0)
    watch.ended("read", 131.5)
    assert watch.stats()["read"] == TaskStats(15.0, runs=2, missed=3, last_seconds=31.5, behind=True)
    (fell,) = behind_lines(caplog)
    assert fell.startswith("Reading the Prometheus source falls behind its 15s interval: its run started 15.0s ago still runs")
    assert "prefixcache_task_runs_missed_total" in fell

    # on time again, but not for long enough: a task on the edge is not said back at every flap
    for k in range(ON_TIME_AGAIN - 1):
        watch.started("read", 145.0 + 15 * k)
        watch.ended("read", 150.0 + 15 * k)
    assert watch.stats()["read"].behind and len(behind_lines(caplog)) == 1
    watch.started("read", 200.0)
    watch.missed("read", 215.0)  # a miss starts the count afresh, and is said no second time
    watch.ended("read", 216.0)
    assert len(behind_lines(caplog)) == 1
    for k in range(ON_TIME_AGAIN):
        watch.started("read", 230.0 + 15 * k)
        watch.ended("read", 234.0 + 15 * k)
    stats = watch.stats()["read"]
    assert stats == TaskStats(15.0, runs=2 + (ON_TIME_AGAIN - 1) + 1 + ON_TIME_AGAIN, missed=4, last_seconds=4.0, behind=False)
    assert behind_lines(caplog)[1:] == ["Reading the Prometheus source keeps its 15s interval again (4 run(s) missed in all)"]
    assert changes  # every change is published


def test_a_reload_keeps_a_tasks_counts_and_a_task_configured_away_is_forgotten():
    watch = TaskWatch()
    watch.expect("discover", 30.0)
    watch.started("discover", 0.0)
    watch.missed("discover", 30.0)
    watch.ended("discover", 31.0)
    watch.expect("discover", 60.0)  # a reload with another refresh_interval: the counters go on
    assert watch.stats()["discover"] == TaskStats(60.0, runs=1, missed=1, last_seconds=31.0)  # a first run's miss: no lag
    watch.forget("discover")
    assert watch.stats() == {}
    watch.missed("discover", 90.0)  # a run of a job being removed: nothing to count it against
    watch.ended("discover", 91.0)
    assert watch.stats() == {}


def test_a_run_a_reload_replaced_the_job_of_is_no_sign_of_falling_behind(caplog):
    """A reload that makes a new reader replaces the read job while a read runs: the new
    job's first run, due at once, finds it running (APScheduler counts instances by job id).
    That miss is counted, not said; a miss after it is."""
    caplog.set_level(logging.INFO, logger="exporter.poll.taskwatch")
    watch = TaskWatch()
    watch.expect("read", 15.0)
    watch.started("read", 0.0)
    watch.ended("read", 5.0)
    watch.started("read", 15.0)
    watch.expect("read", 15.0)  # the reload, before the new job is added
    watch.missed("read", 16.0)
    watch.ended("read", 20.0)
    assert watch.stats()["read"] == TaskStats(15.0, runs=2, missed=1, last_seconds=5.0) and behind_lines(caplog) == []
    watch.started("read", 30.0)
    watch.missed("read", 45.0)
    assert watch.stats()["read"].behind and len(behind_lines(caplog)) == 1


def test_what_two_threads_publish_never_goes_back():
    """A run that ends reads the counts and is preempted before it publishes; a miss on
    the scheduler's thread changes and publishes them meanwhile. Its publication waits for
    the first one's, so the newer counts are published last."""
    published: list[int] = []
    held = threading.Event()
    watch = TaskWatch()

    def changed():
        missed = watch.stats()["read"].missed
        if not held.is_set():
            held.set()
            for _ in range(200):  # the miss lands in the counts while this publication is held up
                if watch.stats()["read"].missed:
                    break
                time.sleep(0.005)
        published.append(missed)

    watch.expect("read", 15.0)
    watch.started("read", 0.0)
    watch.changed = changed
    ender = threading.Thread(target=watch.ended, args=("read", 5.0))
    ender.start()
    assert held.wait(5)
    watch.started("read", 15.0)
    misser = threading.Thread(target=watch.missed, args=("read", 30.0))
    misser.start()
    for thread in (ender, misser):
        thread.join(5)
    assert published == [0, 1] and watch.stats()["read"].missed == 1


def test_a_real_scheduler_that_skips_runs_of_a_slow_job_reports_them_here_not_in_its_own_warning(caplog):
    """APScheduler 3.x does not start a job's run while max_instances of it run, warns at
    each such run and emits EVENT_JOB_MAX_INSTANCES: the watch counts the event and its
    filter keeps the scheduler's warning out of the log."""
    caplog.set_level(logging.INFO)
    watch = TaskWatch()
    scheduler = BackgroundScheduler(executors={"read": ThreadPoolExecutor(1)},
                                    job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None})
    watch.watch(scheduler)
    release, slow = threading.Event(), [False]

    def read():
        watch.started("read", time.monotonic())
        try:
            if slow[0]:
                release.wait(10)
        finally:
            watch.ended("read", time.monotonic())

    watch.expect("read", 0.05)
    scheduler.add_job(read, "interval", id="read", name="read", executor="read", seconds=0.05)
    scheduler.start()
    try:
        deadline = time.monotonic() + 10
        while watch.stats()["read"].runs < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        slow[0] = True  # from the second run on: a first run's misses are not falling behind
        while watch.stats()["read"].missed < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watch.stats()["read"].missed >= 3 and watch.stats()["read"].behind
        slow[0] = False
        release.set()
        while (watch.stats()["read"].behind or watch.stats()["read"].runs < ON_TIME_AGAIN + 1) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        scheduler.shutdown(wait=True)
    stats = watch.stats()["read"]
    assert not stats.behind and stats.runs >= ON_TIME_AGAIN + 1
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "maximum number of running instances" in m]
    assert len([m for m in said if "falls behind" in m]) == 1
    assert len([m for m in said if "keeps its 0.05s interval again" in m]) == 1


def test_the_tasks_are_exported_from_zero_and_a_task_behind_is_on_the_status_page_and_in_its_json():
    state = State()
    state.update(tasks={"evaluate": TaskStats(15.0), "read": TaskStats(15.0, runs=40, missed=12, last_seconds=17.25, behind=True)})
    families = {f.name: f for f in text_string_to_metric_families(exposition(state).decode())}
    samples = {(s.name, s.labels.get("task")): s.value for name in ("prefixcache_task_runs", "prefixcache_task_runs_missed",
                                                                      "prefixcache_task_last_duration_seconds",
                                                                      "prefixcache_task_interval_seconds")
               for s in families[name].samples}
    assert samples == {
        ("prefixcache_task_runs_total", "evaluate"): 0.0, ("prefixcache_task_runs_total", "read"): 40.0,
        ("prefixcache_task_runs_missed_total", "evaluate"): 0.0, ("prefixcache_task_runs_missed_total", "read"): 12.0,
        ("prefixcache_task_last_duration_seconds", "read"): 17.25,  # none before a run ended
        ("prefixcache_task_interval_seconds", "evaluate"): 15.0, ("prefixcache_task_interval_seconds", "read"): 15.0,
    }
    assert status_json(state)["tasks"]["read"] == {"interval_seconds": 15.0, "runs": 40, "missed": 12,
                                                   "last_duration_seconds": 17.25, "behind": True}
    app = App(state, CollectorRegistry(), ready=lambda: (True, ""))
    page = call(app, "GET", "/")[2].decode()
    assert ("Reading the Prometheus source falls behind its 15s interval: its last run took 17.2s; 12 run(s) missed "
            "(prefixcache_task_runs_missed_total).") in page
    state.update(tasks={"read": TaskStats(15.0, runs=44, missed=12, last_seconds=3.5)})  # kept up again
    assert "falls behind" not in call(app, "GET", "/")[2].decode()
