"""How the runner and the trigger poll a job: soon after a short step ends, every
`runner.poll_s` for a long one; logs complete; one job per try."""
from __future__ import annotations

import asyncio
import time

import pytest

from amflow import jobs as J
from amflow.orchestration import airflow_step as A


class Clock:
    """Virtual time for amflow.jobs: sleep advances it, nothing waits."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1e9 + self.now

    def sleep(self, s: float) -> None:
        self.now += s


class FakeBackend:
    """A job that prints one line a second and ends at `end_s` (of `clock`)."""

    mode = "fake"

    def __init__(self, end_s: float, clock=time, partial_tail: str = ""):
        self.end_s, self.clock, self.partial_tail = end_s, clock, partial_tail
        self.t0: float | None = None
        self.status_calls = 0
        self.exists_calls = 0
        self.logs_calls = 0
        self.submits: list[str] = []

    def _elapsed(self) -> float:
        return self.clock.monotonic() - self.t0

    def _text(self) -> str:
        done = self._elapsed() >= self.end_s
        n = int(min(self._elapsed(), self.end_s))
        lines = [f"line {i}" for i in range(n)]
        if done:
            lines.append('AMFLOW_SUMMARY {"step": "fake"}')
        return "".join(x + "\n" for x in lines) + (self.partial_tail if done else "")

    def exists(self, jid: str) -> bool:
        self.exists_calls += 1
        return self.t0 is not None

    def submit(self, jid, argv, resources=None) -> bool:
        if self.t0 is not None:
            return False
        self.submits.append(jid)
        self.t0 = self.clock.monotonic()
        return True

    def status(self, jid: str) -> str:
        self.status_calls += 1
        return J.SUCCEEDED if self._elapsed() >= self.end_s else J.RUNNING

    def logs(self, jid: str, offset: int = 0):
        self.logs_calls += 1
        new = self._text()[offset:]
        end = new.rfind("\n") + 1
        return new[:end], offset + end

    def final_logs(self, jid: str, offset: int = 0):
        text = self._text()
        return text[offset:], len(text)


@pytest.fixture()
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(time, "monotonic", c.monotonic)
    monkeypatch.setattr(time, "sleep", c.sleep)
    return c


def test_poll_starts_short_stays_within_a_tenth_and_caps_at_poll_s():
    assert J.next_poll_s(0.0, 5.0) == J.FIRST_POLL_S == 0.2
    assert J.next_poll_s(1.0, 5.0) == 0.2
    assert J.next_poll_s(12.0, 5.0) == pytest.approx(1.2)
    assert J.next_poll_s(50.0, 5.0) == 5.0 and J.next_poll_s(3600.0, 5.0) == 5.0
    assert J.next_poll_s(0.0, 0.1) == 0.1  # a poll_s below the first poll is honoured
    for t in (2.0, 7.5, 30.0, 49.0):
        assert J.next_poll_s(t, 5.0) <= 0.1 * t + 1e-9


@pytest.mark.parametrize("end_s,max_lag_s", [(0.5, 0.2), (3.0, 0.3), (30.0, 3.0), (600.0, 5.0)])
def test_follow_sees_the_end_within_a_tenth_of_the_run(clock, tmp_path, end_s, max_lag_s):
    backend = FakeBackend(end_s, clock)
    runner = J.StepRunner(backend, tmp_path, poll_s=5.0, emit=lambda line: None)
    out = runner.run("job", ["step"], budget_s=float("inf"))
    assert out.ok and out.summary == {"step": "fake"}
    assert end_s <= clock.now <= end_s + max_lag_s + 1e-9


def test_long_job_is_polled_every_poll_s_after_a_short_start(clock, tmp_path):
    backend = FakeBackend(3600.0, clock)
    runner = J.StepRunner(backend, tmp_path, poll_s=5.0, emit=lambda line: None)
    assert runner.run("job", ["step"], budget_s=float("inf")).ok
    # a fixed 5-s poll makes 721 checks in an hour; the short start adds about 40
    assert backend.status_calls <= 3600 / 5 + 45


def test_the_short_start_adds_status_checks_only_output_comes_every_poll_s(clock, tmp_path):
    backend = FakeBackend(9.5, clock)
    lines: list[str] = []
    runner = J.StepRunner(backend, tmp_path, poll_s=2.0, emit=lines.append)
    assert runner.run("job", ["step"], budget_s=float("inf")).ok
    assert backend.status_calls >= 20  # every 0.2 s at first
    assert backend.logs_calls == 5  # at 0, 2, 4, 6, 8 s; the rest at the end
    assert [x for x in lines if x.startswith("line")] == [f"line {i}" for i in range(9)]


def test_follow_streams_every_line_once_in_order_across_short_tries(clock, tmp_path):
    backend = FakeBackend(7.3, clock, partial_tail="no newline at the end")
    lines: list[str] = []
    runner = J.StepRunner(backend, tmp_path, poll_s=1.0, emit=lines.append)
    out = runner.run("job", ["step"], budget_s=0.7)
    while not out.done:  # later pokes re-attach and go on from the cursor
        out = runner.run("job", ["step"], budget_s=0.7)
        assert not out.submitted
    assert backend.submits == ["job"] and out.ok
    assert lines[0].startswith("[amflow-runner] started fake job job")
    attached = [x for x in lines if x.startswith("[amflow-runner] re-attached")]
    assert len(attached) >= 5
    job_lines = [x for x in lines if not x.startswith("[amflow-runner]")]
    assert job_lines == [f"line {i}" for i in range(7)] + [
        'AMFLOW_SUMMARY {"step": "fake"}', "no newline at the end"]


def test_airflow_step_asks_once_whether_its_job_exists_and_submits_once(tmp_path, monkeypatch):
    backend = FakeBackend(0.5)
    monkeypatch.setattr(A, "make_backend", lambda cfg, state_dir=None, config=None: backend)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"runner: {{state_dir: {tmp_path / 'jobs'}, poll_s: 2}}\n"
                   f"storage: {{root: {tmp_path / 'store'}}}\n")

    def step(try_number: int) -> A.AirflowStep:
        return A.AirflowStep(step="lm", dag_id="d", airflow_run_id="r", task_id="lm",
                             try_number=try_number, config=str(cfg), overrides=[],
                             rerun="resume", emit=lambda line: None)

    first = step(1)
    assert first.start() is True
    assert backend.exists_calls == 1 and backend.submits == [first.job_id]
    again = step(1)  # the same try, re-poked: follows, never a second job
    assert again.start() is False and backend.submits == [first.job_id]
    t0 = time.monotonic()
    out = again.runner.follow(again.job_id, 30.0)
    assert out.ok and time.monotonic() - t0 < 0.5 + 0.45  # not the 2-s poll_s


def test_trigger_fires_soon_after_a_short_job_ends(monkeypatch):
    from amflow.orchestration.trigger import AmflowJobTrigger

    backend = FakeBackend(0.6)
    backend.submit("job", [])
    trigger = AmflowJobTrigger(job_id="job", config="unused.yaml", overrides=[],
                               state_dir="/nonexistent", poll_s=5.0)
    monkeypatch.setattr(trigger, "_backend", lambda: backend)

    async def first_event():
        async for event in trigger.run():
            return event.payload

    event = asyncio.run(asyncio.wait_for(first_event(), 10))
    assert event == {"job_id": "job", "status": J.SUCCEEDED}
    assert time.monotonic() - backend.t0 < 0.6 + 0.45  # not the 2-s cap
