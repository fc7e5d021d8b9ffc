"""Faults on a 3-machine roq cluster in network namespaces (issue 21). Each test runs one
nemesis against machine m1 (which holds ZooKeeper member 1, the first GCM, q1's monitor and
one of its two exchanges) or, for the ZooKeeper leader, wherever that is, while 3 producers
publish with acks=all (R=2); then it checks the history: no acknowledged message lost, none
out of order or twice, none invented, and every producer publishing again (liveness: within
3 × (zk.session.timeout + 5 s) of the fault, of the heal for a partition; the goal of
zk.session.timeout + 5 s is measured by benchmarks/fault_availability.py, docs/benchmarks.md)."""

from __future__ import annotations

import errno
import signal
import time
from pathlib import Path

import pytest
from checker import Report
from faultcluster import SESSION_MS
from faultcpu import Saturation, why_unavailable
from faultnet import Network
from faultrun import RESUME_BOUND_S, FaultRun

from roq.client.live import monitor_status
from roq.protocol.messages.control import MonitorStatus
from roq.testing.cluster import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.xdist_group("faults"), pytest.mark.timeout(300)]

SESSION_S = SESSION_MS / 1000
SATURATION_S = 12.0  # the CPU saturation's length: many of the monitor's 0.6 s deadlines
HEAL_WAIT_S = 60.0  # bound on the cluster's return to full strength after a heal
# Acknowledgements from every producer after a heal: the bound plus slack, so a producer that
# never resumes fails the test here (the checker's availability then says by how much)
ACKS_AFTER_HEAL_S = RESUME_BOUND_S + 20


def _assert_passes(run: FaultRun, report: Report, acks_all: bool = True) -> None:
    print(report.summary())  # shown with -s, and in the failure report
    detail = f"{report.summary()}\n{run.diagnostics()}"
    if acks_all:
        assert report.acked_missing == [], detail
    assert report.order_violations == [], detail
    assert report.duplicates == [], detail
    assert report.never_sent == [], detail
    assert report.counts.get("ok", 0) > 0 and report.faults, detail
    for fault in report.faults:
        assert fault.resume_s <= RESUME_BOUND_S, f"{fault.name} never resumed\n{detail}"
    unserved = run.unserved_lost_logs()
    assert unserved == [], f"lost logs nobody serves: {unserved}\n{detail}"


def _heal_and_settle(run: FaultRun, name: str, from_heal: bool = False) -> None:
    healed = run.nemesis(name, "heal", from_heal)
    run.cluster.wait_hosts(3, HEAL_WAIT_S)
    run.wait_acks(after=healed, count=10, timeout_s=ACKS_AFTER_HEAL_S)


def _kill_m1(fault_run: FaultRun) -> None:
    fault_run.start()
    m1 = fault_run.cluster.machine("m1")
    fault_run.nemesis("kill -9 m1", "start")
    fault_run.cluster.kill_machine(m1)
    fault_run.wait_acks(after=time.time(), count=5, timeout_s=RESUME_BOUND_S + 30)
    fault_run.cluster.restart_machine(m1)
    _heal_and_settle(fault_run, "kill -9 m1")


def test_kill_9_of_every_process_of_a_machine(fault_run: FaultRun) -> None:
    _kill_m1(fault_run)
    _assert_passes(fault_run, fault_run.finish())


def test_kill_9_of_a_machine_with_acks_leader(tmp_path: Path, network: Network) -> None:
    run = FaultRun(tmp_path, network, acks="leader")
    try:
        _kill_m1(run)
        report = run.finish()
        # acks=leader promises nothing for a batch the lost machine held alone: counted, and
        # quoted in docs/guarantees.md, not asserted
        print(f"acks=leader: {len(report.acked_missing)} acknowledged messages missing")
        _assert_passes(run, report, acks_all=False)
    finally:
        run.close()


def test_sigstop_of_a_machine_past_its_session_timeout(fault_run: FaultRun) -> None:
    fault_run.start()
    m1 = fault_run.cluster.machine("m1")
    fault_run.nemesis("SIGSTOP m1", "start")
    stopped = m1.signal_all(signal.SIGSTOP)
    assert stopped, "m1 has no processes"
    time.sleep(SESSION_S + 3)  # the fault's length: past the session timeout
    m1.signal_all(signal.SIGCONT)
    _heal_and_settle(fault_run, "SIGSTOP m1")
    _assert_passes(fault_run, fault_run.finish())


def test_partition_of_a_machine_then_healed(fault_run: FaultRun) -> None:
    fault_run.start()
    m1 = fault_run.cluster.machine("m1")
    fault_run.nemesis("partition m1", "start", from_heal=True)
    m1.partition()
    time.sleep(SESSION_S + 4)  # the fault's length: past the session timeout
    m1.heal_partition()
    _heal_and_settle(fault_run, "partition m1", from_heal=True)
    _assert_passes(fault_run, fault_run.finish())


def test_slow_link_of_a_machine(fault_run: FaultRun) -> None:
    fault_run.start()
    m1 = fault_run.cluster.machine("m1")
    fault_run.nemesis("slow link m1", "start")
    m1.slow("256kbit")
    time.sleep(10)  # the fault's length
    m1.heal_slow()
    _heal_and_settle(fault_run, "slow link m1")
    _assert_passes(fault_run, fault_run.finish())


def test_zookeeper_leader_killed(fault_run: FaultRun) -> None:
    fault_run.start()
    leader = fault_run.cluster.zk_leader()
    assert leader is not None
    zk = next(p for p in fault_run.cluster.on(leader) if p.name.startswith("zk-"))
    assert zk.process is not None
    fault_run.nemesis(f"ZooKeeper leader on {leader.name} killed", "start")
    zk.process.send_signal(signal.SIGKILL)
    zk.reap()
    fault_run.wait_acks(after=time.time(), count=5, timeout_s=RESUME_BOUND_S + 30)
    zk.start()
    _heal_and_settle(fault_run, f"ZooKeeper leader on {leader.name} killed")
    _assert_passes(fault_run, fault_run.finish())


@pytest.mark.parametrize("name", ["m1", "m2"])
def test_cpu_saturation_of_a_machine_declares_no_exchange_dead(
    fault_run: FaultRun, name: str
) -> None:
    """Issue 30 item 6: one machine is saturated for 12 s: its roq processes share, with two
    busy loops, a CPU quota of 5 % of a core per 1 s period (faultcpu.py), so each of them is
    frozen for most of every second and runs late, in bursts, as on the overloaded machine of
    docs/benchmarks.md §4. m1 holds q1's monitor and one exchange: the monitor is as late as
    the exchange. m2 holds only the other exchange: the monitor, on time, hears it late.
    Before the detector knew late from dead, the monitor declared live exchanges dead after its
    3 heartbeats (0.6 s here): with m1 saturated, 13 times in 12 s (26 Nov, at 7df2dd5: m1's
    exchange 9 times, m2's 4, each "silent for 1.0 s"), and publishers moved for nothing. Now
    the monitor does not count time its own loop did not run (m1), and an exchange whose
    control connection is still up is given up to `limits.monitor_late_silence_max_ms` (m2):
    no exchange is declared dead, and the checker's criteria hold as for every fault."""
    if why_unavailable():
        pytest.skip(f"CPU saturation needs a cgroup v1 cpu hierarchy: {why_unavailable()}")
    fault_run.start()
    machine = fault_run.cluster.machine(name)
    saturation = Saturation(machine)
    fault = f"CPU saturation of {name}"
    fault_run.nemesis(fault, "start")
    try:
        assert saturation.start(), f"{name} has no processes"
        time.sleep(SATURATION_S)  # the fault's length
        throttled, periods = saturation.throttled()
    finally:
        saturation.stop()
    _heal_and_settle(fault_run, fault)
    deaths = _log_lines(fault_run, "declared dead")
    print(f"{name} frozen by its quota in {throttled} of {periods} periods; "
          f"{len(deaths)} exchange death(s) declared; the monitor's loop late "
          f"{len(_log_lines(fault_run, 'not counted as its exchanges'))} times, exchanges "
          f"late but kept {len(_log_lines(fault_run, 'late, not dead yet'))} times")  # fmt: skip
    assert throttled >= SATURATION_S - 2, f"frozen in only {throttled} of {periods} periods"
    report = fault_run.finish()
    print(report.summary())
    assert deaths == [], "\n".join(deaths) + f"\n{fault_run.diagnostics()}"
    _assert_passes(fault_run, report)


def _log_lines(run: FaultRun, text: str) -> list[str]:
    """The lines holding `text`, from every process's whole log (the monitors' too)."""
    return [
        line for proc in run.cluster.procs for line in proc.log_text().splitlines() if text in line
    ]


def _fill(path: Path) -> Path:
    """Write zeros until the file system is full (ENOSPC)."""
    filler = path / "filler"
    chunk = b"\0" * (1 << 20)
    with filler.open("wb") as handle:
        while True:
            try:
                handle.write(chunk)
                handle.flush()
            except OSError as error:
                assert error.errno == errno.ENOSPC, error
                break
    return filler


def test_full_log_disk_on_a_machine(tmp_path: Path, network: Network) -> None:
    log_dir = tmp_path / "m1-log"
    network.tmpfs(log_dir, "64m")
    run = FaultRun(tmp_path, network)
    try:
        run.start(log_dirs={"m1": log_dir})
        run.nemesis("full log disk m1", "start")
        filler = _fill(log_dir)
        time.sleep(RESUME_BOUND_S + 3)  # longer than the bound: a stuck publisher fails it
        filler.unlink()
        _heal_and_settle(run, "full log disk m1")
        _assert_passes(run, run.finish())
    finally:
        run.close()


def test_rolling_restart_of_every_machine(fault_run: FaultRun) -> None:
    fault_run.start()
    for name in ("m3", "m2", "m1"):
        machine = fault_run.cluster.machine(name)
        fault_run.nemesis(f"restart {name}", "start")
        fault_run.cluster.stop_gracefully(machine)
        fault_run.cluster.restart_machine(machine)
        _heal_and_settle(fault_run, f"restart {name}")
    _assert_passes(fault_run, fault_run.finish())


def test_kill_9_of_the_machine_of_a_queues_only_exchange_with_a_log_follower(
    tmp_path: Path, network: Network
) -> None:
    """Issue 30, log followers: R=2 with log.followers=1 and one exchange (m1, with q1's
    monitor) whose copy is a follower on m2. m1 killed: the monitor moves, publishers go to a
    new exchange, the lost exchange's log is read from the follower's copy; nothing
    acknowledged (acks=all waited for the follower) is lost."""
    settings = {"log.followers": 1, "scaling.min.exchanges": 1}
    run = FaultRun(tmp_path, network, settings=settings)
    try:
        _kill_m1(run)
        _assert_passes(run, run.finish())
    finally:
        run.close()


@pytest.mark.parametrize("back_after_s", [1.5, 5.0], ids=["within-session", "just-past-loss"])
def test_kill_9_of_a_machine_back_within_seconds(fault_run: FaultRun, back_after_s: float) -> None:
    """Issue 30: a quick return. At 1.5 s the session is alive: nothing is re-placed. At 5 s
    the session (4 s) and the grace (0.5 s) are just over: m1's monitor moved and its exchange
    is being replaced as m1 comes back, the race a returning host must lose cleanly (its lost
    exchange's log served by a keeper, nothing stale left running)."""
    fault_run.start()
    m1 = fault_run.cluster.machine("m1")
    name = f"kill -9 m1, back after {back_after_s} s"
    fault_run.nemesis(name, "start")
    fault_run.cluster.kill_machine(m1)
    time.sleep(back_after_s)  # the fault's length
    fault_run.cluster.restart_machine(m1)
    _heal_and_settle(fault_run, name)
    _assert_passes(fault_run, fault_run.finish())


def _lost(run: FaultRun, host: str) -> bool:
    with run.cluster.admin() as admin:
        queue = next(q for q in admin.status().queues if q.info.name == "q1")
    return any(x.lost and x.host == host for x in queue.exchanges)


def test_a_second_machine_killed_while_the_firsts_log_is_copied_again(fault_run: FaultRun) -> None:
    """Issue 30: m2 killed; once its exchange is lost (its log's only live copy is on m1's
    exchange, sent on as soon as the death is known) m2 starts again and m1 is killed, before,
    while or after that copy is sent on. m2's keeper serves m2's log; nothing acknowledged is
    lost."""
    fault_run.start()
    m1, m2 = fault_run.cluster.machine("m1"), fault_run.cluster.machine("m2")
    fault_run.nemesis("kill -9 m2", "start")
    fault_run.cluster.kill_machine(m2)
    wait_for(lambda: _lost(fault_run, "m2"), SESSION_S + 20, "m2's exchange lost", 0.3)
    fault_run.cluster.restart_machine(m2)
    wait_for(lambda: fault_run.cluster.zk_mode(m2) != "", 30, "m2's ZooKeeper back", 0.2)
    fault_run.nemesis("kill -9 m2", "heal")
    fault_run.nemesis("kill -9 m1 while m2's log is copied again", "start")
    fault_run.cluster.kill_machine(m1)
    fault_run.wait_acks(after=time.time(), count=5, timeout_s=RESUME_BOUND_S + 30)
    fault_run.cluster.restart_machine(m1)
    _heal_and_settle(fault_run, "kill -9 m1 while m2's log is copied again")
    _assert_passes(fault_run, fault_run.finish())


def _q1(run: FaultRun) -> tuple[list[tuple[str, str]], MonitorStatus | None]:
    """q1's recorded exchanges that are not lost, as (host, id), and its monitor's live status."""
    with run.cluster.admin() as admin:
        queue = next(q for q in admin.status().queues if q.info.name == "q1")
    standing = sorted((x.host, x.exchange_id) for x in queue.exchanges if not x.lost)
    return standing, monitor_status(queue.info.monitor_host)


def _copied_in_full(run: FaultRun, leader_id: str, copies: int) -> bool:
    """The monitor lists the gone `leader_id`'s log with `copies` copies, none of them short."""
    _, live = _q1(run)
    if live is None:
        return False
    listed = next((c for c in live.copies if c.leader_id == leader_id), None)
    short = any(s.leader_id == leader_id for s in live.short_logs)
    return listed is not None and len(listed.replicas) >= copies and not short


def test_scale_out_then_in_under_load_then_a_machine_killed(fault_run: FaultRun) -> None:
    """Issue 30: q1 scales out to a third exchange (on m3) and back in (m2's removed) while the
    producers publish with acks=all; the removed exchange's log is copied again at once until it
    has replicationFactor complete copies on live exchanges (scale-in takes no copy away); then
    m1, which holds q1's monitor, an exchange and a copy of the removed log, is killed: the
    removed log is still read from m3's copy and nothing acknowledged is lost."""
    fault_run.start()
    fault_run.nemesis("scale out to m3", "start")
    with fault_run.cluster.admin(timeout_ms=30000) as admin:
        admin.create_exchange("q1", "scale-out-m3", host="m3")
    wait_for(lambda: len(_q1(fault_run)[0]) == 3, 30, "q1's third exchange", 0.3)
    fault_run.wait_acks(after=time.time(), count=10, timeout_s=30)
    standing, _ = _q1(fault_run)
    removed = next(x for host, x in standing if host == "m2")
    fault_run.nemesis("scale in: m2's exchange removed", "start")
    with fault_run.cluster.admin(timeout_ms=30000) as admin:
        admin.remove_exchange("q1", removed)
    wait_for(lambda: all(h != "m2" for h, _ in _q1(fault_run)[0]), 30, "m2's exchange gone", 0.3)
    wait_for(lambda: _copied_in_full(fault_run, removed, 2), 60, "2 copies of the removed log", 0.5)
    fault_run.wait_acks(after=time.time(), count=10, timeout_s=30)
    fault_run.nemesis("kill -9 m1 after the scale-in", "start")
    m1 = fault_run.cluster.machine("m1")
    fault_run.cluster.kill_machine(m1)
    fault_run.wait_acks(after=time.time(), count=5, timeout_s=RESUME_BOUND_S + 30)
    fault_run.cluster.restart_machine(m1)
    _heal_and_settle(fault_run, "kill -9 m1 after the scale-in")
    _assert_passes(fault_run, fault_run.finish())
