"""Timing hooks for tests/integration/test_restart_monitors.py and test_hostloss.py only.

Python imports `sitecustomize` at the start of every process with this directory on PYTHONPATH:
a test puts it there for the roq processes it starts (a host's children inherit the
environment). Each hook is off unless its variable is set; nothing of roq changes otherwise.

- ROQ_TEST_REPLAY_S: each replay of a state log (`log/statelog.py` `_replay`, which
  `StateLog.open` calls) does its work, then that many seconds of pure-Python work more, taking
  and giving back the GIL as a long replay does: a stand-in for a state log too big to replay
  within the host's start deadline, without writing one.
- ROQ_TEST_REPAIR_WAITS_FOR_HOST: the GCM's host-loss repair, once it has read the live hosts
  and decided to move a queue's monitor, waits (at most that many seconds) until a host is
  registered before it reads them again to choose one (`gcm/repair.py`
  `_hosts_with_free_slots`), once per process: as if its thread had been descheduled at that
  point while the gone host registered again (the `roq up` restart race, made certain).
- ROQ_TEST_WITHDRAWAL_UNANSWERED: the GCM's first request to stop a called-off move's monitor
  (1014, `gcm/management.py` `_withdraw`) fails as one the host did not answer in hcmTIMEOUT
  (`HostSilent`), without being sent: the host keeps that monitor until it is asked again.
"""

from __future__ import annotations

import os
import time

_REPLAY_S = float(os.environ.get("ROQ_TEST_REPLAY_S") or 0)
_WAIT_FOR_HOST_S = float(os.environ.get("ROQ_TEST_REPAIR_WAITS_FOR_HOST") or 0)
_WITHDRAWAL_UNANSWERED = bool(os.environ.get("ROQ_TEST_WITHDRAWAL_UNANSWERED"))

if _REPLAY_S > 0:
    from roq.log import statelog

    _replay = statelog._replay

    def _slow_replay(state_log, image):  # type: ignore[no-untyped-def]
        _replay(state_log, image)
        until = time.monotonic() + _REPLAY_S
        while time.monotonic() < until:
            pass

    statelog._replay = _slow_replay

if _WAIT_FOR_HOST_S > 0:
    from roq.gcm import repair

    _choose = repair.HostLossRepair._hosts_with_free_slots
    _waited = []

    def _after_a_host_registered(self):  # type: ignore[no-untyped-def]
        if not _waited:
            _waited.append(True)
            until = time.monotonic() + _WAIT_FOR_HOST_S
            while not self.registry.hosts() and time.monotonic() < until:
                time.sleep(0.05)
            repair.log.warning("test hook: a host is registered; the repair goes on")
        return _choose(self)

    repair.HostLossRepair._hosts_with_free_slots = _after_a_host_registered

if _WITHDRAWAL_UNANSWERED:
    from roq.gcm import management
    from roq.protocol.commands import Reason
    from roq.protocol.messages.host import StopMonitorOnHost

    _call_host = management.Management._call_host
    _dropped = []

    def _first_withdrawal_unanswered(self, host, request, decode):  # type: ignore[no-untyped-def]
        if isinstance(request, StopMonitorOnHost) and not _dropped:
            _dropped.append(True)
            management.log.warning("test hook: the request to stop the monitor is not sent")
            raise management.HostSilent(Reason.HOST_FAILED, f"host {host.name} did not answer")
        return _call_host(self, host, request, decode)

    management.Management._call_host = _first_withdrawal_unanswered
