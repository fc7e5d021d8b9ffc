"""Every bound roq relies on, in one place, with its unit in its name.

Values that an operator may want to change are configuration keys (see `config/keys.py`); these are
the bounds that protect a process from its peers and from itself.
"""

from __future__ import annotations

# --- frames and messages ---------------------------------------------------------------
frame_bytes_max = 16 * 1024 * 1024  # any single ZeroMQ frame we accept
admin_frame_bytes_max = 1024 * 1024  # a BSON admin request; bigger is refused before decoding
message_bytes_max = 4 * 1024 * 1024  # one message's payload
batch_bytes_max = message_bytes_max + 64 * 1024  # one record batch: the largest message fits
key_bytes_max = 255  # routing key
# A record's meta (log format v2, docs/log-format.md §1): headers per record, and the bytes of
# their names and values together; a header name's length is one byte on the wire.
record_headers_max = 32
record_headers_bytes_max = 8 * 1024
record_header_name_bytes_max = 255
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
# the wait before attempt n + 1 grows by the first each time (0.3 s x n, backoff.py), up to the
# max, which the 10 attempts never reach
client_retry_backoff_ms = 300
client_retry_backoff_ms_max = 3_000
# A client whose GCM has not answered for this long says what it waits for (once per operation)
client_wait_notice_s = 1.0
client_slow_wait_notice_s = 5.0  # ... for a request that starts processes (a queue's create)

# --- host loss (gcm/repair.py) -----------------------------------------------------------
host_loss_check_s = 1.0  # the leading GCM looks for lost hosts this often
host_loss_queues_per_pass = 8  # queues re-placed per check at most: bounded work per pass
host_loss_gone_max = 1_000  # gone hosts the GCM remembers (and `roq status` lists)
# a host that missed "monitor moved" (1013) is asked again after 1 s, 2 s, 4 s … up to 30 s,
# until it answers, is lost, or no longer runs an exchange of the queue
monitor_moved_retry_first_s = 1.0
monitor_moved_retry_max_s = 30.0
monitor_moved_untold_max = 1_000  # (queue, host) pairs waiting to be told again, at most
# A host that did not answer the request to stop the monitor started for a called-off move
# (1014, gcm/repair.py) is asked again with the same back-off, this many times at most (about
# 4 minutes), while it stays registered (registering again, it stops that monitor itself).
monitor_withdraw_retries_max = 10
host_loss_stop_join_s = 5.0  # the GCM's close waits this long for its repair thread
# a repair's wait on a host ends this soon after the GCM lost the lead (transport/rpc.py)
request_cancel_poll_ms = 100
# A GCM's call to a host looks this often whether the host was restarted or left meanwhile (a
# registry read): a call the dead host held ends then, not at hcmTIMEOUT.
host_call_check_s = 0.5
# A publisher whose oldest unconfirmed batch (or flush) has waited `first` asks the GCM whether
# its queue's monitor moved (client/publisher.py), then again after 2 x first, 4 x first … up to
# `max` apart while the stall lasts, one question in flight (in a thread of its own, so a GCM
# that does not answer never holds up the publisher's I/O): it follows a re-placed monitor
# within `max` of the GCM's record of it, and a stall costs the GCM a few cheap reads.
publisher_monitor_check_first_ms = 250
publisher_monitor_check_max_ms = 1_000
# an acks="none" publisher probes its exchange (a drain request) at most this often
publisher_monitor_check_ms = 2_000
# that question, one attempt (client/locate.py): a GCM answers it from one ZooKeeper read, so
# one silent this long is taken for dead (a leader that died, which ZooKeeper names until its
# session expires) and the next question looks the leader up again
monitor_locate_timeout_ms = 1_000

# --- supervision -------------------------------------------------------------------------
child_restart_backoff_ms_min = 250
child_restart_backoff_ms_max = 10_000
child_restarts_max = 10  # consecutive fast failures before a child is given up and reported
child_stable_after_ms = 10_000  # a child that lived this long resets its failure count
# children not running (restarting or given up) a host lists in its ZooKeeper record and in 2013
host_children_reported_max = 100
# a child stopping gets this long after its SHUTDOWN request, then SIGTERM and this long again,
# then SIGKILL (supervision.stop)
shutdown_grace_ms = 5_000
child_tell_timeout_ms = 2_000  # a control request a host forwards to a child (MONITOR_MOVED)
# A stopping host asks each child to SHUTDOWN with this bound before it signals it (a child
# still starting does not answer: the signals follow)
child_shutdown_ask_ms = 500
# A child that loses a port race to another program gets this many port blocks before the host
# gives up starting it (host/service.py).
child_bind_attempts = 3

# A host's exchanges when exchange.max.perhost is 0 (the default), derived at its start from
# the machine (host/capacity.py): per core, and per memory budget of one exchange (its memory
# log, log.memory.bytes, plus this for the process, its buffers and its share of the queue's
# monitor: an idle exchange is ~45 MiB, one under full load 130-210 MB, benchmarks.md), never
# fewer than the floor (the fixed default until 26 Nov 2026) nor more than the key's bound.
host_exchanges_per_core = 8  # an idle exchange takes ~1-2 % of a core, a busy one about one
host_exchange_memory_bytes = 128 * 1024 * 1024
host_exchanges_floor = 8
host_exchanges_ceiling = 1000

# `roq up` restarts a GCM, host or ZooKeeper it started that died, after a back-off that
# doubles from the min to the max; one that lived `up_stable_after_s` resets it.
up_restart_backoff_s_min = 0.5
up_restart_backoff_s_max = 30.0
up_stable_after_s = 30.0
up_ready_timeout_s = 60.0  # `roq up` gives up when its GCM and host are not serving by then
# `roq up` told to stop gives its gateway, host and GCM this long together, then kills them:
# a host stops its children at once within shutdown_grace_ms, so this is the whole stop's bound
up_stop_s = 4.5
up_gateway_stop_s = 2.0  # of which the gateway (first: its publisher flushes to live exchanges)

# --- ZooKeeper ---------------------------------------------------------------------------
zk_connect_timeout_s = 10.0
zk_server_start_timeout_s = 30.0  # `roq up`'s embedded ZooKeeper must answer `ruok` within this
zk_reconnect_delay_max_s = 2.0  # kazoo's default grows to an hour; we never wait that long
zk_command_retries_max = 5
# The longest any ZooKeeper request waits for its answer (kazoo's own wait has no bound while the
# connection is down); past it the request fails like a lost connection.
zk_request_timeout_s = 10.0
zk_close_timeout_s = 3.0  # a session's close waits this long at most (coordination/session.py)
# A watch whose read failed (coordination/watches.py) reads again after this, doubling to the
# most: a read that timed out no longer leaves the watch unset until the next reconnection.
zk_watch_retry_first_s = 0.5
zk_watch_retry_max_s = 10.0
# A host whose session expired tries to register again at most this often.
host_reregister_interval_s = 1.0
# A host whose name is still registered by a session that is not its own waits this many
# session timeouts (plus the margin) for it to expire before it gives up (exit 75), polling.
host_name_wait_sessions = 1.5
host_name_wait_margin_s = 2.0
host_name_wait_poll_s = 0.5
zk_probe_timeout_s = 1.0  # a shutdown skips its ZooKeeper clean-up if a probe waits longer
# What one ZooKeeper server that roq runs (`roq up`'s, the image's roq-zookeeper) lets its clients
# hold (local/zkserver.py, ami/files/zoo.cfg; docs/security.md §4). Before them an anonymous
# client filled it until OutOfMemoryError (80 MB in 1.2 s). Connections: one machine's roq
# processes (a GCM, a host, a gateway, the monitors that keep delivery state there, commands)
# under the first, every machine's under the second.
zk_server_connections_per_address_max = 500  # maxClientCnxns
zk_server_connections_max = 2_000  # maxCnxns
# The largest request (and znode) it reads: ZooKeeper's own default, set explicitly; roq's largest
# znode is a 64 KiB task record (task_result_zk_bytes_max), a principal at most 32 KiB.
zk_server_request_bytes_max = 1024 * 1024  # -Djute.maxbuffer
# A request past this is "large": such requests read and not yet answered hold at most
# zk_server_large_requests_bytes_max together, and one past that closes its connection. So the
# requests a server holds are bounded by connections x threshold + that: 32 + 32 MiB here,
# well inside the embedded server's 256 MiB heap.
zk_server_large_request_bytes = 16 * 1024  # largeRequestThreshold
zk_server_large_requests_bytes_max = 32 * 1024 * 1024  # largeRequestMaxBytes
zk_server_outstanding_max = 1_000  # globalOutstandingLimit: requests queued past it stall reads
# Fencing (host/fencing.py): a host's children act only under a lease this share of
# zk.session.timeout long, renewed this many times per lease while the host's session answers.
# Shorter than the session, so the lease of a host cut off ends before ZooKeeper expires it
# (and the GCM re-places its work host.loss.grace later): docs/guarantees.md §10.
host_lease_session_share = 0.5
host_lease_renewals = 4
# A child whose lease ended this many zk.session.timeouts ago and was not renewed exits by
# itself (EXIT_FENCED, system/lease.py): by then its host's session has been without an answered
# renewal for a whole session (expired, or the host stopped or cut off), so the GCM may have
# re-placed its work; a host that never comes back leaves nothing running. Two, not one: a host
# whose session expired has that long again to register and confirm its lease (a ZooKeeper
# outage longer than this costs the children a restart, by their host, once it answers again).
child_fenced_exit_sessions = 2.0
# Assignment epochs (protocol/epoch.py): the senders of stale-epoch messages a client or an
# exchange logs (once each, at debug); refusals past this many sources are only counted.
epoch_stale_sources_logged_max = 64
zk_client_session_ms = 4_000  # the session of a client that only looks the GCM leader up
# A new GCM leader retries creating its leader znode this many times, 0.1 s apart, while its
# predecessor's ephemeral one vanishes with that session (coordination/election.py).
leader_create_tries = 50
# A stopping GCM waits this long for its election thread to hand the leadership back.
election_stop_join_s = 5.0
gcm_stop_deadline_s = 10.0  # a GCM told to stop exits by then, whatever it waits for

# --- polling -------------------------------------------------------------------------------
poll_interval_ms = 100  # control loops wake at least this often to run their timers
# An exchange whose main loop has not turned for this long is dead to its monitor even while
# its pulse thread still beats (exchange/pulse.py); shorter stalls (a saturated disk) are survived.
exchange_loop_stall_max_ms = 10_000
# Late is not dead (monitor/detector.py, issue 30 item 6). An exchange silent past its
# monitor.dead.heartbeats whose control connection is still up (its process alive, so its
# kernel has not closed it) is declared dead only after this much silence: on a machine past
# CPU saturation reports and pulses came 1.6-3.4 s late (docs/benchmarks.md §4), and this is
# what a frozen (SIGSTOP) or unreachable one costs in detection. A killed one's connection
# drops at once: it is declared dead after its heartbeats, as before.
monitor_late_silence_max_ms = 5_000
# A monitor loop turn this much later than its poll's timeout (starved of CPU, or blocked) is
# time it did not listen: not counted as its exchanges' silence. Above a turn's ordinary
# jitter (milliseconds), below the shortest deadline a test sets (3 x 0.2 s).
monitor_turn_late_ms = 250
# Starved is not dead either (monitor/detector.py, `Lateness`): an exchange heard again after a
# silence of g s within the last monitor_starved_memory_ms has its late bound stretched to
# monitor_starved_stretch x g, at most monitor_starved_silence_max_ms. Twice: a machine whose
# starvation deepens (the gaps grow as load is added) is kept through the next, longer gap.
# The ceiling is what a frozen or cut-off exchange on a machine already seen starved costs in
# detection; below 2 zk.session.timeouts (12 s by default) plus a lease (3 s), after which a
# cut-off host's children have exited by themselves (child_fenced_exit_sessions).
monitor_starved_stretch = 2.0
monitor_starved_silence_max_ms = 15_000
monitor_starved_memory_ms = 60_000

assert admin_frame_bytes_max <= frame_bytes_max
assert message_bytes_max < batch_bytes_max <= frame_bytes_max
# the largest message with the largest meta (~8.3 KiB) and key still fits one batch
assert message_bytes_max + 2 * record_headers_bytes_max + 4 * key_bytes_max <= batch_bytes_max

# --- control messages: the schemas of protocol/messages ----------------------------------------
message_str_chars_max = 1024  # a string field without a bound of its own
message_list_items_max = 100_000  # a list field without a bound of its own (frames bound it too)
# A reply's COMMENT may quote a host's or a handler's error, and a scaling event's reason lists
# the load of every exchange.
reply_comment_chars_max = 64 * 1024
producer_id_chars_max = 64  # a producer id in hex (16 bytes today)
transaction_id_chars_max = 128  # TransactionID of 2004 and 1009
exchange_id_request_chars_max = 256  # an exchange id a request names (2014, 1010)
cluster_hosts_max = 10_000  # hosts in one reply (2, 2013) or config broadcast
cluster_queues_max = 100_000  # queues in one reply (2, 2012, 2013) or config broadcast

# --- control plane: GCM ----------------------------------------------------------------------
rules_listeners_max = 16  # rules listeners (2008) kept per queue; the oldest is dropped
listener_hwm = 16  # notices queued for one registered listener (PUSH, never waited on)
rules_updates_hwm = 16  # rule changes (from the GCM) a monitor's scaler queues unread
ec2_request_attempts = 2  # one retry, with the same client token: still one instance at most

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
# ... and one leaving (it said so), within this: it answers at once unless it died after saying
# it (SIGTERM, then SIGKILL; a machine's crash); the full 10 s then kept its publishers idle.
publisher_leaving_drain_ms = 2_000
# A publisher without an exchange asks its monitor again after `first`, doubling up to this
# often: a monitor just re-placed knows its exchanges within milliseconds of their being told
# (they report as soon as it subscribes), so the first retries are short.
placement_retry_first_ms = 100
placement_retry_ms = 500
# A monitor answers a placement from memory: one silent this long may be dead (its host lost
# with it), so the publisher asks it again, and the GCM meanwhile whether it moved.
placement_request_timeout_ms = 1_000
placement_timeout_ms = 30_000  # ... and gives up (raises) after this long
unconfirmed_batches_max = 10_000  # batches kept for re-sending until the exchange confirms them
# Replies (acks, drain answers) an exchange queues for one publisher. A ROUTER drops what is
# past its high-water mark, silently, and a lost drain answer hangs flush(): this must exceed
# what a publisher can have outstanding (its unconfirmed batches and its flushes). ~40 bytes
# each.
exchange_replies_hwm = 2 * unconfirmed_batches_max

# --- data plane: exchanges ----------------------------------------------------------------
# Publishers' batches handled per poll wake-up before timers and control get a turn ...
exchange_burst_batches = 256
# ... or this many bytes of them: with big batches 256 are 16 MiB or more, and a subscriber
# catching up from the log waits a burst for each read (its catch-up then trails the live rate)
exchange_burst_bytes = 4 * 1024 * 1024
# An exchange whose log refused an append (a full or read-only disk) tries, every heartbeat, to
# write this much to a scratch file beside its log; once that works it takes publishers again.
# As big as the batches a log commonly takes, so a disk with a few bytes free does not make it
# flap between refusing and taking publishers.
exchange_space_probe_bytes = 1024 * 1024
exchange_leave_quiet_s = 0.5  # after leaving, exit once publishers were silent this long ...
exchange_leave_max_s = 3.0  # ... or after this long in any case (the host waits 5 s: SIGTERM)
exchange_producers_tracked_max = 100_000  # beyond this, a period's extra producers count as one
log_server_burst_requests = 64  # log reads and replication writes answered per wake-up (F+3)
# Log reads and replication writes queued per peer on the log port (F+3), each way. A reader has
# one read in flight and a leader's answers are cumulative (the next supersedes a lost one); a
# peer that sends more without reading loses answers past it (a ROUTER drops them).
log_server_hwm_messages = 100
# Reports and KPI samples an exchange queues for its monitor: the next supersedes each one.
exchange_reports_hwm = 100
exchange_kpi_hwm = 100
exchange_pulse_hwm = 10  # liveness pulses queued: only the latest matters
# A monitor's report and KPI inputs (from every exchange and subscriber of the queue) and its
# notices to publishers, subscribers and KPI readers: each is superseded by the next or asked
# again (a client that missed a notice learns it at its next request), so past this ZeroMQ drops.
monitor_stream_hwm = 10_000
monitor_control_hwm = 10  # requests (1030, 1031) queued to one exchange's control port
log_reader_hwm = 10  # a log reader (subscriber feed, consumer) has one read in flight
subscriber_stat_hwm = 100  # a subscriber's KPI samples queued for its monitor
replication_link_hwm = 10_000  # writes (each ≤ the back-fill read) and probes queued per replica
log_seek_reads_max = 100_000  # reads a time seek may take (each ≤ dataplane.READ_BYTES_MAX)
# How often a replicating leader notes its log's end, for the in-sync rule (the notes kept are
# bounded by the replica lag over this).
replication_end_sample_s = 0.1
replication_backfill_read_bytes = 1024 * 1024  # one back-fill read from the log
replication_window_bytes = 8 * 1024 * 1024  # sent to a replica and not yet acknowledged
# A replica that lacks part of the log as it stood this long ago is out of sync (Kafka's
# replica.lag.time.max.ms): acks=all waits for a slow replica at most about this long.
replica_lag_s = 3.0
# acks=all confirms nothing before the monitor has said who copies the log (its first REPLICAS
# after the exchange started: sent when the exchange joins, and every monitor.list.period), for
# at most this long; past it, with no word, it confirms on the leader alone and says so. Without
# the wait, a fresh or restarted exchange confirmed on the leader alone until then, and a kill
# of its machine lost what it had confirmed (the fault harness, kill -9: 68 messages).
acks_all_assignment_wait_s = 5.0
# An acks=all batch waits this long for min.insync.copies copies in sync, then is refused
# (retriable): long enough for a replica's restart or a new exchange's back-fill, short
# enough that a publisher hears well inside its flush timeout.
acks_all_insync_wait_s = 5.0
# The monitor's delivery-state log (monitor/state.py): a memory tail that serves its copies'
# back-fill without a disk read (a turn's batch is KiBs), segments small enough that compaction
# frees space soon after the live state shrinks, and the replies that may wait for its copies
# (a reply per request in flight: a requester has one at a time per call).
state_memory_bytes = 4 * 1024 * 1024
state_segment_bytes = 8 * 1024 * 1024
state_held_replies_max = 10_000
# A reply waits this long for its state's copies, then is refused (busy, retriable, naming the
# copies missing): below a client's request timeout (work_request_timeout_ms), so the client
# hears why rather than a silence, and asks again.
state_reply_wait_s = 1.5
# A monitor placed under a new epoch looks this long for copies of an older state log (the
# queue's exchanges report theirs within a heartbeat of hearing of it) before it starts empty;
# it reads one with these bounds (a read answers at most dataplane.READ_BYTES_MAX).
state_recovery_wait_s = 3.0
state_recovery_read_timeout_ms = 5_000
state_recovery_reads_max = 100_000
# The monitor's poll while replies wait for copies: a copy's answer wakes the poll at once; this
# bounds how late the in-sync and refusal checks run when none comes.
state_pending_poll_ms = 10
# A queue with fewer exchanges than replicationFactor asks for another, first after this long
# (its monitor just started: its first exchange reports within a heartbeat), then again after
# a back-off from the first to the second bound (the cluster may have no room, or the monitor
# not yet know every exchange: each try is a GCM request and a scaling event).
copies_floor_start_s = 0.5
copies_floor_retry_first_s = 0.5
copies_floor_retry_s = 2.0
replica_logs_max = 256  # leaders one exchange keeps copies for (a stranger cannot make more)
# A replica that refused a leader (not assigned to it yet, a disk error) is asked again this
# long after: a restarted replica learns its leaders within one monitor.list.period.
replication_refused_retry_s = 0.5
# What a refusal echoes back: the leader id frame as sent (cut), and the reason.
replication_leader_id_bytes_max = 256
replication_refusal_chars_max = 300
# A gone exchange's log (dead, lost with its host, retired by a scale-in) is copied again at
# once until it has replicationFactor complete copies on live exchanges: by the replication
# sender, windowed like replication (replication_window_bytes per target, 1 MiB per frame).
recopy_targets_max = 8  # targets one exchange sends copies of gone logs to at once
# De-duplication by message id (log/dedup.py, dedup.window.ms): message ids one window holds at
# most (an exchange's, a consumer group's), about 86 bytes each (docs/benchmarks.md, "De-dup
# window"): 2,000,000 ids are ~170 MiB, a 2-minute window up to ~16,700 ids/s. Past it the
# oldest ids are forgotten before their time (counted): a duplicate of one is taken as new.
dedup_window_ids_max = 2_000_000
dedup_bucket_ms = 1_000  # the window expires its ids a bucket of this many ms at a time
# An exchange rebuilds its window at its start from its log's tail written within the window,
# reading at most this many bytes of it (the newest), so a restart stays within the host's
# start bound (child_ready_timeout_ms).
dedup_rebuild_bytes_max = 64 * 1024 * 1024

# --- data plane: subscribers --------------------------------------------------------------
subscriber_hwm_batches = 10_000  # batches ZeroMQ queues for one subscriber socket
subscriber_reorder_batches_max = 1_000  # out-of-order batches held while waiting for a gap
# Batches one feed of a logged exchange may have held: a batch beyond it (or beyond the total
# above) is not held but read again from the log once something was delivered (client/feed.py
# `rewind`). Skipping the gap instead, as the total above once did for every feed, dropped a
# replay's readable records: one 4 MiB log read holds thousands of small batches.
subscriber_held_per_feed_max = 250
subscriber_gap_wait_ms = 2_000  # a gap not filled within this is reported as lost
# A feed reading the log this far behind its end stops taking the live stream until it has
# caught up: the catch-up then gets the subscriber's whole time (client/feed.py).
subscriber_live_pause_bytes = 16 * 1024 * 1024
subscriber_idle_probe_ms = 2_000  # a feed silent this long asks its exchange's log where it ends
subscriber_refresh_ms = 2_000  # while a feed is silent, ask the monitor for the list this often
subscriber_refresh_timeout_ms = 1_000  # ... and wait this long for its answer
# a joining subscriber waits this long for the monitor's list before it asks again (and asks the
# GCM whether the monitor moved: a lost host's monitor never answers)
subscriber_join_request_timeout_ms = 2_000
subscriber_streams_max = 1_000_000  # (producer, key) streams tracked for order and duplicates
subscriber_burst_batches = 1_024  # batches taken from one live stream per wake-up
subscriber_stat_period_s = 1.0  # a subscriber sends its statistics to the stat monitor this often
subscriber_corrupt_logged_max = 10  # corrupt batches a feed logs; the rest are only counted
# Delayed records (not_before_us in the future) a subscriber holds, with the later records of
# their streams, until they come due (client/timing.py `DelayGate`); at the bound it takes no
# more batches until some come due (ZeroMQ drops for it alone and the log gives them back).
subscriber_delay_held_max = 100_000

# --- data plane: monitor ------------------------------------------------------------------
monitor_publishers_max = 1_000_000  # publishers a monitor remembers placements for
# A placement counts towards its exchange's load this long, until the exchange's own report
# includes the publisher; at most this many recent placements are remembered per exchange.
placement_memory_s = 10.0
placement_memory_max = 1_000
monitor_load_samples_max = 10_000  # load samples kept per exchange, whatever the window
exchange_producers_reported_max = 32  # most active producers an exchange names per report
exchange_subscriptions_notice_ms = 50  # a changed subscription count is told at most this often
# Exchange reports, or statistics, handled per wake-up before the monitor's other sockets and
# timers get a turn.
monitor_burst_messages = 256
monitor_exchanges_max = 10_000  # exchanges one monitor tracks; reports of any more are ignored
monitor_copies_announced_max = 1_000  # copies of other logs one exchange may announce
stat_frames_max = 4  # frames of one statistics message into the stat monitor (S+0)
stat_frame_bytes_max = 64 * 1024  # one frame of it

# --- scaling: the monitor's scaler and its actuator thread ---------------------------------
scaling_actions_queued_max = 4  # decisions queued for the actuator (one is in flight at a time)
scaling_results_queued_max = 64  # actuator results waiting for the monitor's main thread
scaling_admin_retries = 3  # attempts per admin request (each bounded by the AdminClient's timeout)
scaling_rules_retry_s = 1.0  # a failed rules refresh is retried this soon (doubling each time)
scaling_events_kept = 20  # recent scaling events shown by `roq status`
scaling_fresh_wait_s = 30.0  # a created exchange that never reports is given up on after this
scaling_rebalance_retry_s = 0.5  # filling a new exchange found nothing to move: look again then
scaling_actuator_join_s = 0.5  # closing the monitor waits this long for the (daemon) actuator

# --- message log ----------------------------------------------------------------------------
log_scan_chunk_bytes = 1024 * 1024  # recovery and inspection read segments in chunks this big
log_read_files_max = 16  # closed segments kept open for reading (least recently used closed)
# A log offset is a byte position, and no log reaches 2**60 bytes (1 EiB: 36 years at 1 GB/s).
# An offset at or past this, in a frame or a segment file's name, is refused where it enters:
# it would otherwise reach BSON (int64) in a report, or a file name (issue 16).
log_offset_max = 2**60
# Sequence numbers and timestamps travel as unsigned 64-bit fields but may reach BSON (int64).
int64_max = 2**63 - 1
log_damage_kept_max = 1_024  # damaged offsets whose resume point a log remembers (readers ask)

# --- state log (log/statelog.py): keyed delivery state kept as a compacted log -----------------
# A key names a task, a group's slot or a topic's head: ids of up to 64 characters (task ids,
# queue names) joined with a kind and a group name, with room to spare.
state_key_chars_max = 512
# A value is one record of delivery state (a task with its payload and result): what ZooKeeper
# held in one znode (jute.maxbuffer, 1 MiB), plus room for the record's own fields.
state_value_bytes_max = 1024 * 1024 + 64 * 1024
# A state log shorter than this is never compacted: replaying it on open is quick, and each
# compaction rewrites every live key.
state_compact_min_bytes = 16 * 1024 * 1024
# ... past it, compaction runs once the log holds this many times the live records' bytes: a
# snapshot then costs at most what was written since the last one, and at most half of the
# log a replay reads is superseded. Above 1, or a fresh snapshot would call for the next.
state_compact_ratio = 2.0
# A snapshot packs live records into batches of about this size (a larger record goes alone):
# one replication back-fill read carries one, and a replica's copy moves in such steps.
state_snapshot_batch_bytes = replication_backfill_read_bytes
# The owner's loop compacts a few keys a turn, never the whole state at once: at ~30 µs a key,
# 300,000 keys kept the monitor from answering for 9 s (26 Nov). Appends go on between slices.
state_compact_keys_per_turn = 2_000
# One change of the largest key (4 UTF-8 bytes a character) and value fits one batch: the BSON
# fields and the batch's header take well under 1 KiB.
assert state_value_bytes_max + 4 * state_key_chars_max + 1024 <= batch_bytes_max
assert state_compact_ratio > 1
assert state_snapshot_batch_bytes <= batch_bytes_max

# --- roq bench ------------------------------------------------------------------------------
bench_ready_timeout_s = 30.0  # a bench subscriber process must say it is ready within this
bench_drain_quiet_s = 1.5  # run by hand (no count told): stops after the run once quiet this long
bench_drain_stall_s = 10.0  # told the count: a subscriber short of it gives up after this silence
bench_drain_max_s = 60.0  # ... or this long after it was told at the latest
bench_publishers_grace_s = 60.0  # publishers get their seconds + this to end (then killed)
bench_flush_timeout_s = 45.0  # a bench publisher's last flush (its count is reported either way)
bench_stop_grace_s = 0.5  # `roq bench` stopped: its workers get this long after SIGTERM
bench_latency_samples_max = 20_000  # latency samples kept per worker and run

# --- the HTTP gateway (roq/http/); its API limits are keys (maxQueueSize, maxMsgSize, ...) ----
http_body_bytes_max = 16 * 1024 * 1024  # one request body, read in chunks; past it: 400/413
http_batch_messages_max = 1_000  # messages of one v2 batch publish
http_requests_max = 2_000  # requests in progress (long polls included); past it uvicorn says 503
http_workers_max = 16  # threads that run ZooKeeper and publisher calls (never the event loop)
http_cas_attempts_max = 100  # compare-and-set attempts of one head update among racing gateways
http_wait_s_max = 30.0  # the longest v2 long-polling get
http_catchup_s = 3.0  # a get waits this long for the log to bring a message ZooKeeper says exists
http_publish_timeout_s = 10.0  # the exchange must confirm a publish's messages within this
http_waiters_max = 10_000  # long polls parked at once; past it a get answers without waiting
# A topic's monitor (its state, client/topics.py) restarting or moving is waited for this long,
# then the request answers 503: a monitor restart takes 1-3 s, a re-placement after a host loss
# the ZooKeeper session and host.loss.grace; a worker thread is not held longer than a publish.
http_monitor_wait_s = 10.0
http_consumer_retry_s = 1.0  # a log consumer that failed starts again after this
http_publisher_replace_s = 1.0  # a failed publisher is replaced at most once per this, per queue
http_keepalive_s = 5  # an idle keep-alive connection is closed after this
http_shutdown_s = 5  # on SIGTERM, requests in progress get this long to finish
# Before a caller has shown a token (http/guard.py, issue 31 finding 5): a connection must send a
# whole request head within this of opening and of each response (idle or half a head, it held a
# connection for ever, and 2,000 such made every request a 503); a head larger than this is a 400
# (h11's bound; the largest roq needs is a 512-character Authorization); connections open from
# one IP address (more are closed at once): an eighth of http_requests_max, so one address cannot
# take them all, and more than a client of the gateway holds at once.
http_head_s = 10.0
http_head_bytes_max = 16 * 1024
http_connections_per_ip_max = 256
# After it (http/api.py): requests in progress per principal, past which a 429 (half of
# http_requests_max: one token cannot take the gateway from the others); the body of a call that
# carries names only (every call but publish), refused by its Content-Length before it is read
# (three names of maxNameLen characters, each up to 6 bytes as JSON escapes, with room); a body
# must arrive whole within this (a trickled body holds its request); a body larger than this is
# parsed on a worker thread, not the event loop.
http_principal_requests_max = 1_000
http_small_body_bytes_max = 64 * 1024
http_body_read_s = 30.0
http_parse_inline_bytes_max = 64 * 1024
# The gateway's snapshot of its index (http/snapshot.py): taken this often while messages come
# (a kill -9 costs a re-read of at most this much of the log), copied off the event loop this
# many topics per loop turn, written through a buffer of this size.
http_snapshot_interval_s = 30.0
http_snapshot_topics_per_turn = 2_000
http_snapshot_buffer_bytes = 1024 * 1024
# A message's time to live and delay as `roq pub --ttl/--delay` and a v2 publish's `ttl`/`delay`
# take them (the record carries absolute µs, docs/log-format.md §1): a year at most, far past any
# topic's retention, so a typo of a unit is refused rather than kept for centuries.
message_ttl_ms_max = 365 * 24 * 3600 * 1000
message_delay_ms_max = 365 * 24 * 3600 * 1000
# The gateway's index of places (http/index.py `Places`, issue 34): a kept message's place is a
# 2-byte tag (its exchange's number, withheld) and a 4-byte log offset (8 once a log passes
# 4 GiB), in arrays that span a topic's newest maxQueueSize indexes (a hole, an index whose
# publish failed, costs as much) plus at most a sixteenth of evicted places and array's slack of
# a sixteenth: at most http_place_bytes_max bytes per index (10 x 16/15 x 17/16 = 11.3, rounded
# up), whatever the message's size, so a topic's places take at most 12 x maxQueueSize bytes.
# The tag numbers this many exchanges at once (numbers no kept message names are reused).
http_place_bytes_max = 12
http_index_exchanges_max = 32_767
# --- work queues: consumer groups (monitor/slots.py, monitor/groups.py, client/consumer.py) ---
work_cuts_reported_max = 1_024  # slot boundaries in one exchange report (past it: thinned evenly)
work_cuts_repeated = 16  # reported cuts an exchange repeats in its next reports (a lost report)
work_groups_max = 64  # consumer groups per queue
work_group_name_chars_max = 40  # so that the dead-letter queue `<queue>.<group>.dlq` fits 64
work_slots_max = 100_000  # live (not yet deleted) slots per group; past it, no new slot is cut
work_parked_slots_max = 64  # slots a consumer holds handed out whole, awaiting settlement
work_slot_messages_max = 1_000_000  # messages one slot may hold (its settled set is this big)
work_consumers_max = 1_000  # consumers per group
work_items_per_request_max = 10_000  # indices in one request's list (give, ack, nack, reject)
work_reason_chars_max = 200  # a nack's or reject's reason, as kept and sent to dead letters
work_backoff_max_s = 60.0  # the redelivery back-off never exceeds this
work_poll_ms = 25  # a consumer with nothing to do asks its monitor again at most this late
# A request/response Worker's consumer with nothing to do asks with a LEASE the monitor may hold
# (at most this long: work_poll_ms, so never later than a polling consumer) until a requester's
# TASK_GET says a request of its service was just published; at most this many held at once.
work_lease_wait_max_ms = 25
work_lease_waiters_max = 1_000
# ... and a requester's wake that found none held is kept this long for the group's next LEASE
work_lease_wake_kept_ms = 500
work_poll_min_ms = 5  # ... and first this soon, twice as late at each empty answer (to poll_ms)
work_share_lead_slots = 2  # ... and none takes this many slots more than one that asked within
work_share_lead_window_ms = 300  # ... this window (bytes leased; monitor/slots.py, _too_far_ahead)
work_share_window_ms = 300  # a consumer that asked this recently counts for the fair shares
work_ack_flush_ms = 50  # acks wait at most this long in a consumer before going on the wire
work_request_timeout_ms = 2_000  # a consumer's request to the monitor (then it asks again)
work_read_timeout_ms = 2_000  # a slot's read from an exchange's log (then the slot is returned)
work_state_writes_per_turn_max = 256  # slot records one monitor loop turn writes to ZooKeeper
work_delay_max_ms = 86_400_000  # a nack's delay
# Dead-letter redrive and purge (`roq group dlq redrive|purge`, monitor/deadletters.py): at most
# this many letters per step, each step one commit of the group's state (its new one-message
# slots and the letters' removal together); a group remembers at most this many removed letters.
work_dlq_step_max = 200
work_dlq_removed_max = 100_000
work_dlq_letter_id_chars_max = 100  # `<publisher hex>:<key digest>:<seq>` of a letter on the dlq
work_dlq_busy_retry_s = 30.0  # a step the monitor answers busy (restarting) is asked again so long
# A consumer puts off a message whose not_before_us has not come (Settle's Defer): it goes to
# no consumer before then. The monitor keeps the time as a nack's; at most this far ahead
# (a later time is put off again when it is reached: no delay is cut short).
work_defer_max_ms = 86_400_000
work_monitor_wait_s = 30.0  # a consumer waits this long for its monitor (restart, move) to answer
work_sync_wait_ms = 5_000  # a SETTLE with Sync (flush, close) waits this long for ZooKeeper
work_write_retry_ms = 200  # after a failed group-state commit, the next one waits this long
work_unconfirmed_max = 64  # settles a consumer keeps unconfirmed (not yet Written); then Sync
# A waiting consumer reads the open end of each live exchange's log (at most this many, this
# much, this long) and the monitor cuts a slot there: no wait for the next report (500 ms)
work_tail_exchanges_max = 64
work_tail_read_bytes = 1024 * 1024
work_tail_timeout_ms = 200
work_exec_timeout_s = 3600.0  # `roq work --exec`: a command running longer is killed (nack)
# An idle `roq work` waits for its next message in slices this long, so that Ctrl-C and SIGTERM
# stop it within one (issue 32: it waited for a message first, for ever on an idle queue).
work_cli_stop_check_s = 0.2
# A `roq work --exec` command still running when its consumer is stopped gets this long after
# SIGTERM before SIGKILL (and its message is released): the whole stop stays within a second.
work_exec_stop_grace_s = 0.3
# ... which first gets this long from the stop to finish (its message acked, its request's result
# stored: a stop loses no run that ends by then), waited for in slices of exec_stop_check_s
exec_stop_finish_s = 0.4
exec_stop_check_s = 0.05
# A consumer told to stop (Consumer.stop_with) gives its requests to the monitor this long more,
# then ends them: a gone monitor (its queue deleted) does not hold the stop for work_monitor_wait_s.
work_stop_grace_s = 0.3
# Consumer priorities (monitor/selection.py, issue 33 item 6): a consumer joins with a priority
# within ±this; its prefetch (JOIN's Inflight) at most work.inflight's own bound.
work_consumer_priority_max = 1_000
work_inflight_max = 1_000_000
# Key-ordered groups (monitor/keyed.py): a key's partition is crc32(key) mod the group's parts;
# each part is held by one consumer at a time across every log of the queue.
work_key_parts = 16  # parts of a key-ordered group (Consumer(key_ordered=True), roq work)
work_key_parts_max = 256  # ... at most (each range of a log is cut into one slot per part)
work_key_read_cache_max = 8  # ranges a consumer keeps read (its parts' slots share the bytes)
# After a publisher moved off a log, the other logs' new slots of a key-ordered group wait until
# the old log's records up to where its last report says it ended (after the drain bound) are
# settled; a barrier never blocks longer than this (crossing moves), then is dropped, logged.
work_key_barrier_max_s = 60.0

# --- request/response through queues (client/requests.py, monitor/tasks.py) ---------------------
# A task's record, its result included, is one record of the queue's state log (delivery.state=
# log): a result up to 1 MiB. With delivery.state=zookeeper it is one znode, which ZooKeeper
# refuses past jute.maxbuffer (1 MiB) and the collector reads whole: results stay at 64 KiB there.
task_result_bytes_max = 1024 * 1024  # a result (or its error text) a worker may store
task_result_zk_bytes_max = 64 * 1024  # the same, with delivery.state=zookeeper
task_payload_bytes_max = 1024 * 1024  # a request's payload (a message of the queue)
# A request to the monitor's placement socket: a TASK_FINISH carries a whole result.
task_frame_bytes_max = task_result_bytes_max + 64 * 1024
assert task_result_bytes_max + 4 * 1024 <= state_value_bytes_max  # a record holds its result
# A Worker runs at most this many requests at once (`roq serve --concurrency`, JLupin's
# threadAmount): each is a handler thread and a link to the monitor of its own.
worker_concurrency_max = 256
# A Worker waits for its next request this long at a time (its consumer's LEASE may be held by
# the monitor meanwhile); with requests running, this shorter time, so it settles the finished
# ones and renews the leases of the others in time.
worker_idle_poll_s = 0.2
worker_busy_poll_s = 0.05
task_id_chars_max = 64  # a task id / request id names a znode
task_error_chars_max = 2_000  # an error kept with a failed task
task_pattern_chars_max = 500  # exceptionStringToRepeat, a regular expression
task_gc_batch = 200  # task records the monitor's collector reads per pass (bounded work per tick)
task_tombstone_s = 3_600.0  # a collected task answers "expired" this long, then is deleted
# A monitor that starts, is fenced or recovers its state log has not heard from the workers
# that were connected: it counts no look for a worker (request.delegator.repeats) until this
# long after it serves again. Each of them asks again within it: a request's timeout
# (work_request_timeout_ms), a locate (monitor_locate_timeout_ms), the retry.
task_worker_rejoin_ms = 5_000
task_poll_ms = 10  # how often Task.result() asks while it waits, when its monitor holds no wait
# A Worker renews its delivery's lease while the handler runs, this share of work.lease.ms apart
# (three renewals per lease: one lost or late request does not lose it), never more often than
# the floor; at each renewal it asks the task's state, and stops renewing once the task is final.
task_lease_renew_share = 1 / 3
task_lease_renew_min_ms = 50
task_records_max = 1_000_000  # task records one queue keeps (a submit past it is refused)
task_claim_chars_max = 64  # a submit() call's claim token (TaskSubmit, monitor/tasks.py)
# A result handed to `Task.result()` is acknowledged with the requester's next request to the
# monitor (its `Acks`), at most this many per request; past it, or at close, at once.
task_acks_per_request_max = 64
# The monitor owns every write to its queue's task records, so it answers from a cache of those
# it read or wrote (an LRU, bounded by count and by the bytes of the results it holds; ZooKeeper
# stays the truth: a monitor started or re-placed begins empty and reads it there).
task_cache_records_max = 10_000
task_cache_bytes_max = 64 * 1024 * 1024
# A TASK_GET may wait (a long poll) until its task is final: at most this long (well within the
# client's request timeout, work_request_timeout_ms), and at most this many waiting at once per
# monitor (past it, a TASK_GET is answered at once and its client polls every task_poll_ms).
task_wait_max_ms = 1_000
# A requester's reply stream (a DEALER to the monitor, client/requests.py) subscribes to each
# of its tasks' outcome with a TASK_GET held this long at most (no request timeout to stay
# within: the monitor grants up to this), then subscribes again; at most this many
# subscriptions per requester (past it, `Task.result()` long-polls on its own), and this many
# messages queued each way on the stream's socket: so a requester holds at most
# 1,000 × task_result_bytes_max of outcomes pushed and not yet taken (one that does not fit is
# dropped by the monitor's socket and subscribed to again).
task_watch_max_ms = 10_000
task_stream_watches_max = 1_000
task_stream_hwm = 1_000
task_waiters_max = 10_000
# The task writes of one monitor loop turn go to ZooKeeper as one multi (one round trip, one
# fsync), at most this many per multi; a multi with a failed write is sent again without it, at
# most this many times in a row (each time one write fewer at least).
task_writes_per_commit_max = 256
task_commit_rounds_max = 8
# A worker's availability check (JLupin's checkAvailableScript: `roq serve --check-available`,
# `Worker(available=...)`): asked this often by default, within these bounds; a command running
# longer than its timeout is ended and counts as "not available". While not available the worker
# takes no request: it lets its running ones finish, then leaves its group (its slots go to the
# service's other workers) until a check says available again.
worker_check_period_s = 5.0
worker_check_period_min_s = 0.1
worker_check_period_max_s = 3_600.0
worker_check_timeout_s = 5.0
worker_check_output_chars_max = 500  # of a failing check's output, logged with its exit
# `roq serve --memory-max MB` (JLupin's MEMORY_ERRORS: isRestartOnError, howManyTimes,
# percentageGrowth): the supervising `roq serve` reads its worker's resident memory (the worker
# process and the --exec commands it runs, /proc) this often; past the threshold the worker
# finishes its running requests (at most work_exec_timeout_s plus the margin, then it is killed)
# and is started again with the threshold raised by the growth, at most the restarts given.
serve_memory_check_s = 0.5
serve_memory_mb_min = 16
serve_memory_mb_max = 1_048_576
serve_memory_growth_pct_max = 1_000
serve_memory_restarts_max = 1_000
serve_memory_growth_pct = 25  # JLupin's percentageGrowth
serve_memory_restarts = 4  # JLupin's howManyTimes
serve_drain_margin_s = 60.0
serve_stderr_line_bytes_max = 64 * 1024  # a worker's stderr line the supervisor passes on

# --- security (CurveZMQ, issue 23) ------------------------------------------------------------
# A CURVE handshake not finished within this is dropped by either side, so a refused or
# mismatched peer (NULL client, unknown key, wrong server key) ends in an error, not a hang.
handshake_timeout_ms = 3_000
# Handshakes failing without detail in a row before a client calls it a refusal (a wrong server
# key gives no detail, nor does a connection cut mid-handshake, which the reconnection mends).
handshake_failures_undetailed = 3
# Where `roq up` and a first GCM or host write the cluster's keys when `security.dir` is not set
# (beside the default `directory`, roq-data/log), and where clients look last.
security_dir_default = "roq-data/security"
security_file_bytes_max = 64 * 1024  # a credentials file larger than this is refused
# ZooKeeper's TLS (transport/certificates.py, docs/security.md §4): one PEM text of cluster.json's
# `zk_tls` (a P-256 certificate is ~600 characters, its key ~240), and how long what the first
# start makes stays valid: as long as the cluster's CURVE key, which expires never; 100 years
# stands for that, since a certificate must end (a new one comes with a new cluster key, §6).
zk_tls_pem_chars_max = 8192
zk_tls_validity_days = 36_500
principals_max = 10_000  # principals of one cluster (ZooKeeper children read at each change)
# queue-name prefixes one principal holds grants on; as many `topic:` prefixes besides
principal_grants_max = 256
# One principal as a host's principals file holds it: 256 queue grants of 64-character prefixes
# and 256 topic grants of 70 with all four permissions (~110 and ~120 bytes each), 16 token
# digests (68 each), its name and key: ~60 KB.
principal_record_bytes_max = 64 * 1024
# The whole file a monitor or exchange reads: every principal the cluster may hold, each at its
# largest. A table read in part would be no table (it was 1 MiB: ~850 principals with 16 tokens,
# and past it revoked keys kept passing); a larger file is refused, and refusing denies.
principals_file_bytes_max = principals_max * principal_record_bytes_max
principals_poll_s = 0.5  # a monitor or exchange re-reads its host's principals file this often
# A revoked key's open connections are cut within this (ZooKeeper's watch, the host's file, a
# child's poll, the cutter's poll): the bound is 5 s.
revocation_cut_s = 5.0
principal_cas_attempts_max = 20  # compare-and-set attempts of one `roq keys` change
refusal_log_interval_s = 60.0  # a refused key is logged at most this often per socket domain
refusal_log_keys_max = 1_000  # (key, domain) pairs remembered for that (then forgotten at once)
# And at most this many refusal lines per interval in one process, whatever the keys: a holder
# of the cluster's public key made one line per random key (300 in 0.5 s). Past it refusals are
# counted, and the count is logged with the next line once the interval has passed.
refusal_log_lines_max = 10
# HTTP bearer tokens one principal holds (their SHA-256 digests, in its ZooKeeper record); a new
# one past this is refused: `roq keys token NAME --revoke-all` drops them.
principal_tokens_max = 16
# The longest Authorization header value the gateway hashes; a longer one is no roq token: 401.
# (roq's tokens are 47 characters; uvicorn's h11 bounds the whole head at 64 KiB anyway.)
http_authorization_chars_max = 512
# A topic's, owner's or subscriber's name as a gateway's monitor request carries it: the largest
# maxNameLen (config/keys.py); and the largest maxTopics / maxSubscribers a request names.
http_name_chars_max = 1_000
http_limit_max = 10_000_000

# --- the cluster's secret in AWS Systems Manager Parameter Store (issue 23) --------------------
# `roq keys ssm-put|ssm-get` (roq.cloud.parameters): the cluster.json an EC2 host fetches at boot.
ssm_parameter_name_chars_max = 1011  # SSM's own limit on a parameter name, its path included
ssm_value_bytes_max = 4096  # a Standard-tier parameter's value; a compact cluster.json is ~2 KB
# Connect and each read of one SSM request, per attempt; GetParameter and PutParameter are
# idempotent, so a failed attempt is retried (botocore's standard mode: throttling, 5xx, timeouts).
ssm_request_timeout_s = 10.0
ssm_request_attempts = 3

# --- metrics and health (roq/metrics/, protocol/metrics.py; docs/operations.md, "Metrics") ----
# Series are bounded by their labels: a process exports the series of at most this many queues
# (the first by name; the others are counted in roq_host_series_dropped_total), a monitor those
# of at most this many consumer groups, a label value at most this many characters.
metrics_queues_max = 100
metrics_groups_max = 50
metrics_label_chars_max = 200
metrics_samples_max = 10_000  # samples of one child's METRICS reply
# A host asks each child for its samples with this bound, and spends at most the budget on all
# of them in one scrape (a child that does not answer is skipped: Prometheus's scrape_timeout
# defaults to 10 s).
metrics_child_timeout_ms = 1_000
metrics_gather_budget_s = 5.0
# The listener (/metrics, /healthz, /readyz): requests served at once (past it: 503), and how
# long a connection may take to send its request.
metrics_connections_max = 16
metrics_request_timeout_s = 5.0
# /healthz fails when the process's main loop has not turned for this long: a host's loop may
# block up to child_ready_timeout_ms while a child starts, plus a stop's grace.
health_loop_stall_s = 30.0
# /readyz's and `roq health`'s checks: each of its requests (a child's PING, a ZooKeeper read)
health_check_timeout_ms = 1_000
# Targets (roq/metrics listeners) a cluster registers in ZooKeeper, read by `roq metrics
# scrape-config` and `roq health`, at most.
metrics_targets_max = 1_000
# A process looks this often whether its target znode (coordination/targets.py) still exists
# (a session that expired took it) and writes it again.
metrics_target_check_s = 5.0

# --- publisher KPIs (CMD 11, 12; client/publisher.py, monitor/publishers.py) ----------------
publisher_stat_period_s = 1.0  # a publisher sends its 11 and 12 to the stat monitor this often
publisher_stat_hwm = 100  # a publisher's KPI messages queued for its monitor
# Publishers whose KPIs one monitor keeps for its STATUS (`roq status`): the first this many
# heard; a publisher past it is counted (`PublishersUntracked`), not kept. One silent this long
# (closed, or moved to another queue's monitor) is forgotten, which frees its place.
monitor_publisher_kpis_max = 1_000
publisher_kpi_forget_s = 30.0
status_publishers_shown_max = 10  # `roq status` lists the busiest this many per queue

# --- a consumer group's de-duplication by message id (monitor/groupids.py, dedup.window.ms) ---
# Ids one group's window holds (each with the place of the copy it hands out: about 200 bytes
# in the monitor, tracemalloc of 100,000 ids, so at most ~20 MB a group): a 2-minute window
# holds every id up to ~830 ids/s a group. Past it the oldest are forgotten before their time
# and counted (roq_group_dedup_forgotten_total): a copy of a forgotten id is handed out again.
work_dedup_ids_max = 100_000
work_dedup_ids_per_request_max = 10_000  # (index, id) entries in one SETTLE's Ids (200 KB)
# The window's ids are kept in the state log (delivery.state=log) as records of at most this
# many entries (about 120 bytes an entry, at most ~400 with the longest exchange id: under
# state_value_bytes_max either way).
work_dedup_ids_per_record_max = 2_000
# ... saved at most this often (a group commit may come every request: a record each would fill
# the state log with small keys); what a monitor crash loses of it is missed duplicates only.
work_dedup_save_ms = 250
