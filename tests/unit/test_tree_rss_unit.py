"""`procstat.tree_rss_bytes` (roq serve --memory-max): a process's resident memory with its
descendants', from /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from roq.system.procstat import tree_rss_bytes
from roq.testing.cluster import wait_for

MB = 1024 * 1024
HOLD = "import sys, time; held = b'x' * (64 * 1024 * 1024); print(flush=True); time.sleep(30)"


def test_a_grandchilds_memory_counts_and_a_gone_process_is_zero():
    shell = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "{HOLD}"; :'],
                             stdout=subprocess.PIPE, start_new_session=True)  # fmt: skip
    try:
        assert shell.stdout is not None and shell.stdout.readline() == b"\n"  # it holds 64 MB
        assert tree_rss_bytes(shell.pid) > 64 * MB
    finally:
        os.killpg(shell.pid, signal.SIGKILL)  # the shell and its python
        shell.wait(10)
    wait_for(lambda: tree_rss_bytes(shell.pid) == 0, 10, "the reaped shell counts nothing")
