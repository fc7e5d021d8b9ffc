"""Every bound roq relies on, in one place, with its unit in its name.

Values that an operator may want to change are configuration keys (see `config.py`); these are
the bounds that protect a process from its peers and from itself.
"""

from __future__ import annotations

# --- frames and messages ---------------------------------------------------------------
frame_bytes_max = 16 * 1024 * 1024  # any single ZeroMQ frame we accept
admin_frame_bytes_max = 1024 * 1024  # a BSON admin request; bigger is refused before decoding
message_bytes_max = 4 * 1024 * 1024  # one message's payload
batch_bytes_max = message_bytes_max + 64 * 1024  # one record batch: the largest message fits
key_bytes_max = 255  # routing key
queue_name_chars_max = 64

# --- sockets -----------------------------------------------------------------------------
socket_linger_ms = 0  # control sockets: never block a shutdown on unsent replies
data_linger_ms = 5_000  # data sockets: give queued messages a bounded time to leave
data_hwm_messages = 1_000  # ZeroMQ frames queued per peer on data sockets (frames are batches)
control_hwm_messages = 1_000

# --- request/reply ---------------------------------------------------------------------
request_timeout_ms = 5_000  # a REQ waits this long for its reply
admin_request_timeout_ms = 30_000  # creating a queue starts processes: allow more
child_ready_timeout_ms = 15_000  # a spawned monitor/exchange must answer PING within this
client_retry_max = 10  # attempts to reach the GCM leader (RoQ: 10)
client_retry_backoff_ms = 300

# --- supervision -------------------------------------------------------------------------
child_restart_backoff_ms_min = 250
child_restart_backoff_ms_max = 10_000
child_restarts_max = 10  # consecutive fast failures before a child is given up and reported
child_stable_after_ms = 10_000  # a child that lived this long resets its failure count
# a child stopping gets this long after its SHUTDOWN request, then SIGTERM and this long again,
# then SIGKILL (supervision.stop)
shutdown_grace_ms = 5_000

# --- ZooKeeper ---------------------------------------------------------------------------
zk_connect_timeout_s = 10.0
zk_reconnect_delay_max_s = 2.0  # kazoo's default grows to an hour; we never wait that long
zk_command_retries_max = 5
# The longest any ZooKeeper request waits for its answer (kazoo's own wait has no bound while the
# connection is down); past it the request fails like a lost connection.
zk_request_timeout_s = 10.0
# A host whose session expired tries to register again at most this often.
host_reregister_interval_s = 1.0
zk_probe_timeout_s = 1.0  # a shutdown skips its ZooKeeper clean-up if a probe waits longer

# --- polling -------------------------------------------------------------------------------
poll_interval_ms = 100  # control loops wake at least this often to run their timers
# An exchange whose main loop has not turned for this long is dead to its monitor even while
# its pulse thread still beats (roq/pulse.py); shorter stalls (a saturated disk) are survived.
exchange_loop_stall_max_ms = 10_000

assert admin_frame_bytes_max <= frame_bytes_max
assert message_bytes_max < batch_bytes_max <= frame_bytes_max

# --- data plane: publishers -------------------------------------------------------------
publisher_batch_bytes_default = 64 * 1024  # a batch is sent once its payloads reach this
publisher_linger_ms_default = 2  # ... or once its oldest message waited this long
publisher_buffer_bytes_max = 32 * 1024 * 1024  # encoded batches waiting for the socket
# ... and at most this many of them: unbatched messages are small, but each costs the exchange
# a frame, so a byte bound alone would let a fast producer queue seconds of backlog.
publisher_pending_batches_max = 5_000
publisher_block_ms_default = 30_000  # a full buffer blocks send() this long, then raises
publisher_keys_max = 100_000  # distinct routing keys (each has its own sequence) per publisher
drain_timeout_ms = 10_000  # an old exchange must confirm a drain within this before a move
publisher_dead_drain_ms = 300  # ... and one declared dead, within this (it may be only slow)
placement_retry_ms = 500  # a publisher without an exchange asks its monitor again this often
placement_timeout_ms = 30_000  # ... and gives up (raises) after this long
unconfirmed_batches_max = 10_000  # batches kept for re-sending until the exchange confirms them
# Replies (acks, drain answers) an exchange queues for one publisher. A ROUTER drops what is
# past its high-water mark, silently, and a lost drain answer hangs flush(): this must exceed
# what a publisher can have outstanding (its unconfirmed batches and its flushes). ~40 bytes
# each.
exchange_replies_hwm = 2 * unconfirmed_batches_max

# --- data plane: subscribers --------------------------------------------------------------
subscriber_hwm_batches = 10_000  # batches ZeroMQ queues for one subscriber socket
subscriber_reorder_batches_max = 1_000  # out-of-order batches held while waiting for a gap
subscriber_gap_wait_ms = 2_000  # a gap not filled within this is reported as lost
# A feed reading the log this far behind its end stops taking the live stream until it has
# caught up: the catch-up then gets the subscriber's whole time (client/feed.py).
subscriber_live_pause_bytes = 16 * 1024 * 1024
subscriber_idle_probe_ms = 2_000  # a feed silent this long asks its exchange's log where it ends
subscriber_refresh_ms = 2_000  # while a feed is silent, ask the monitor for the list this often
subscriber_refresh_timeout_ms = 1_000  # ... and wait this long for its answer
subscriber_streams_max = 1_000_000  # (producer, key) streams tracked for order and duplicates

# --- data plane: monitor ------------------------------------------------------------------
monitor_publishers_max = 1_000_000  # publishers a monitor remembers placements for
exchange_producers_reported_max = 32  # most active producers an exchange names per report
exchange_subscriptions_notice_ms = 50  # a changed subscription count is told at most this often

# --- message log ----------------------------------------------------------------------------
log_scan_chunk_bytes = 1024 * 1024  # recovery and inspection read segments in chunks this big
log_read_files_max = 16  # closed segments kept open for reading (least recently used closed)
