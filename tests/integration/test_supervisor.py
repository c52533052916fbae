"""The local cluster's supervisor on tiny real processes (`python -c` children): a crash is restarted
with growing delays and counted with its exit code, a service that keeps crashing is given up on, an
on-failure service that exits 0 stays down, and stopping leaves no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.processes import ServiceProcess
from cluster.supervisor import (
    START_FAILED_EXIT_CODE,
    RestartMode,
    RestartPolicy,
    ServiceState,
    SupervisionRecord,
    Supervisor,
)
from tests.polling import wait_for

pytestmark = pytest.mark.integration

FAST = RestartPolicy(base_delay_s=0.05, max_delay_s=0.2, max_restarts=3, window_s=60.0)


def child(code: str, log_dir: Path, name: str = "child"):
    """A start function for the supervisor: `python -c code`, output to <log_dir>/<name>.log."""

    def start() -> ServiceProcess:
        log_path = log_dir / f"{name}.log"
        with open(log_path, "ab") as log_file:
            popen = subprocess.Popen(
                [sys.executable, "-c", code], stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
            )
        return ServiceProcess(name, popen, log_path)

    return start


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_crashing_service_is_restarted_with_backoff_then_given_up_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    supervisor = Supervisor()
    crash = "import sys; print('OSError: [Errno 98] Address already in use'); sys.exit(3)"
    first = supervisor.add("crasher", child(crash, tmp_path), FAST)

    def settled() -> bool:
        supervisor.poll()
        return supervisor.state("crasher") == ServiceState.GAVE_UP

    wait_for(settled, "the supervisor to give up on the crasher", timeout_s=20)
    service = supervisor.services["crasher"]
    record = supervisor.summary().services["crasher"]
    assert record.num_restarts == FAST.max_restarts == 3
    assert record.crash_exit_codes == [3, 3, 3, 3]  # the last crash is the one it gave up after
    assert record.gave_up and record.state == ServiceState.GAVE_UP
    assert service.child.pid != first.pid
    # each crash's warning ends with the end of the crashed child's log: its cause
    crashes = [record.getMessage() for record in caplog.records if "crashed with exit code 3" in record.getMessage()]
    assert crashes and all(message.endswith("Address already in use") for message in crashes), crashes
    # each restart waited at least its backoff after the previous one: 0.05, 0.1, 0.2 s
    times = list(service.restart_times_s)
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    assert gaps[0] >= FAST.delay_s(2) and gaps[1] >= FAST.delay_s(3)
    assert [FAST.delay_s(n) for n in (1, 2, 3, 4, 5)] == [0.05, 0.1, 0.2, 0.2, 0.2]
    # given up: more polls start nothing
    for _ in range(5):
        supervisor.poll()
    assert supervisor.summary().services["crasher"].num_restarts == 3

    path = tmp_path / "supervision.json"
    supervisor.write_summary(path)
    assert SupervisionRecord.model_validate_json(path.read_text()).num_restarts == 3


def test_a_killed_service_comes_back_and_an_on_failure_service_that_exits_0_stays_down(tmp_path: Path) -> None:
    supervisor = Supervisor()
    sleeper = supervisor.add("worker", child("import time; time.sleep(600)", tmp_path, "worker"), FAST)
    on_failure = RestartPolicy(mode=RestartMode.ON_FAILURE, base_delay_s=0.05, max_delay_s=0.2)
    supervisor.add("learner", child("print('run complete')", tmp_path, "learner"), on_failure)
    try:
        os.kill(sleeper.pid, signal.SIGKILL)

        def worker_back() -> bool:
            supervisor.poll()
            return supervisor.child("worker").pid != sleeper.pid and supervisor.state("worker") == ServiceState.RUNNING

        wait_for(worker_back, "the killed worker to be started again")
        wait_for(lambda: supervisor.poll() or supervisor.state("learner") == ServiceState.EXITED, "the learner's exit")
        assert supervisor.child("worker").exit_code() is None
        records = supervisor.summary().services
        assert (records["worker"].num_restarts, records["worker"].crash_exit_codes) == (1, [-signal.SIGKILL])
        assert (records["learner"].num_restarts, records["learner"].crash_exit_codes) == (0, [])
        supervisor.restart_now("learner")  # what the runner does when the learner stopped short of its run
        assert supervisor.summary().services["learner"].num_restarts == 1
    finally:
        supervisor.stop(["worker", "learner"])
    assert all(supervisor.state(name) == ServiceState.STOPPED for name in ("worker", "learner"))


def test_stop_by_pid_leaves_no_process_behind(tmp_path: Path) -> None:
    supervisor = Supervisor()
    pids = [
        supervisor.add(f"s{i}", child("import time; time.sleep(600)", tmp_path, f"s{i}"), FAST).pid for i in range(3)
    ]
    supervisor.poll()
    assert not any(gone(pid) for pid in pids)
    supervisor.stop(["s2", "s1", "s0"])
    assert all(gone(pid) for pid in pids)
    assert [supervisor.child(f"s{i}").exit_code() for i in range(3)] == [-signal.SIGTERM] * 3
    supervisor.poll()  # stopped services are not restarted
    assert [supervisor.child(f"s{i}").pid for i in range(3)] == pids


def test_a_service_that_cannot_be_started_again_uses_up_its_restarts_instead_of_ending_the_runner(
    tmp_path: Path,
) -> None:
    starts = child("import sys; sys.exit(1)", tmp_path, "flaky")
    num_calls = []

    def start() -> ServiceProcess:
        num_calls.append(1)
        if len(num_calls) > 1:
            raise RuntimeError("redis-server did not load its data within 60s")  # as RedisServer.start() raises
        return starts()

    supervisor = Supervisor()
    supervisor.add("flaky", start, FAST)
    wait_for(lambda: supervisor.poll() or supervisor.state("flaky") == ServiceState.GAVE_UP, "giving up on it")
    record = supervisor.summary().services["flaky"]
    assert (record.num_restarts, record.crash_exit_codes) == (3, [1, START_FAILED_EXIT_CODE, 255, 255])
