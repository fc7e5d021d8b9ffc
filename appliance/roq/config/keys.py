"""The key tables of GCM.properties and HCM.properties: every key roq reads, declared once.

Each key has its type, default, bounds and meaning. The shipped files in `config/` are rendered
from these tables (`render`; a test diffs them), so the documentation of a key and its behaviour
cannot drift apart. What reads each key is `components.py`, beside this table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from roq import limits
from roq.errors import ConfigError

Value = int | float | bool | str


@dataclass(frozen=True, slots=True)
class Key:
    """One configuration key: its name as it appears in the file, its type and its bounds."""

    name: str
    type: type
    default: Value
    doc: str
    bounds: tuple[float, float] | None = None
    choices: tuple[str, ...] = ()
    section: str = ""

    def parse(self, raw: str, where: str) -> Value:
        text = raw.strip()
        try:
            value = self._convert(text)
        except ValueError:
            raise ConfigError(
                f"{where}: key '{self.name}' has value {raw!r}: expected {self._expected()}"
            ) from None
        self._check(value, raw, where)
        return value

    def _convert(self, text: str) -> Value:
        if self.type is bool:
            lowered = text.lower()
            if lowered in ("true", "yes", "on", "1"):
                return True
            if lowered in ("false", "no", "off", "0"):
                return False
            raise ValueError(text)
        if self.type is int:
            return int(text)
        if self.type is float:
            return float(text)
        return text

    def _check(self, value: Value, raw: str, where: str) -> None:
        if self.bounds is not None and isinstance(value, int | float):
            low, high = self.bounds
            if not low <= value <= high:
                raise ConfigError(
                    f"{where}: key '{self.name}' has value {raw!r}: must be between "
                    f"{_fmt(low)} and {_fmt(high)}"
                )
        if self.choices and value not in self.choices:
            raise ConfigError(
                f"{where}: key '{self.name}' has value {raw!r}: must be one of "
                f"{', '.join(self.choices)}"
            )

    def _expected(self) -> str:
        return {bool: "true or false", int: "an integer", float: "a number"}.get(
            self.type, "a string"
        )


def _fmt(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


PORT = (1024.0, 65535.0)
METRICS_PORT = (0.0, 65535.0)  # 0: off
MS = (10.0, 86_400_000.0)

_ZK_KEYS = (
    Key(
        "zk.servers",
        str,
        "127.0.0.1:2181",
        "ZooKeeper connect string (host:port,...).",
        section="ZooKeeper",
    ),
    Key(
        "zk.namespace",
        str,
        "/roq",
        "Root znode of this cluster; several clusters may share "
        "one ZooKeeper under different namespaces.",
        section="ZooKeeper",
    ),
    Key(
        "zk.session.timeout",
        int,
        6000,
        "ZooKeeper session timeout in ms: a dead process's "
        "ephemeral znodes (hosts, the GCM leader) vanish within this time.",
        (2000, 60000),
        section="ZooKeeper",
    ),
)

_SECURITY_KEYS = (
    Key(
        "security",
        bool,
        True,
        "CurveZMQ on every socket and digest ACLs on every znode (docs/security.md). off: "
        "nothing authenticates or encrypts anything, for benchmarks only; it is logged as a "
        "warning at every start.",
        section="Security",
    ),
    Key(
        "security.dir",
        str,
        limits.security_dir_default,
        "Directory of the cluster's secrets (cluster.json, admin.json, mode 0600), written by the "
        "first GCM, host or `roq up` that finds none; every GCM and host machine needs the same "
        "cluster.json.",
        section="Security",
    ),
    Key(
        "zk.tls",
        bool,
        True,
        "TLS to ZooKeeper, with the certificates of cluster.json (docs/security.md §4): "
        "zk.servers names ZooKeeper's secure port, and `roq up`'s ZooKeeper serves TLS only. "
        "false: plain TCP, for an external ZooKeeper without TLS; the digest credential and "
        "every znode then cross the network in clear (logged as a warning at every start).",
        section="Security",
    ),
    Key(
        "http.queue.prefix",
        str,
        "http",
        "Names of the HTTP gateway's queues: <prefix>-0, <prefix>-1, ... (created by the gateway "
        "if missing). They are the cluster's: no grant gives publish, subscribe or consume on "
        "them; set the same value in GCM.properties and HCM.properties.",
        section="Security",
    ),
)

_LOGGING_KEYS = (
    Key(
        "log.format",
        str,
        "text",
        "Form of the process's log lines on stderr: text (one line each, for people) or json (one "
        "JSON object per line: time, level, logger, message, process, pid, and host, queue, "
        "exchange where the process knows them). A host and `roq up` pass it to what they start.",
        choices=("text", "json"),
        section="Logging",
    ),
)

GCM_KEYS: tuple[Key, ...] = (
    Key(
        "ports.base",
        int,
        5000,
        "Base of the GCM ports: +0 topology requests (BSON), "
        "+3 admin API (BSON, RoQ commands 2000-2011), +5 config broadcast (PUB, CMD 1500).",
        (1024, 65529),
        section="Ports",
    ),
    Key(
        "metrics.port",
        int,
        0,
        "Port of the GCM's HTTP listener on network.interface: GET /metrics (Prometheus), "
        "/healthz and /readyz, without authentication (docs/operations.md, Metrics). 0: no "
        "listener. roq up sets it.",
        METRICS_PORT,
        section="Ports",
    ),
    Key(
        "network.interface",
        str,
        "127.0.0.1",
        "Address the GCM binds and announces. An IP address, or an interface name such as eth0.",
        section="Ports",
    ),
    Key(
        "period",
        int,
        5000,
        "Period of the config broadcast on ports.base+5, in ms (RoQ's default was 60000).",
        MS,
        section="Timing",
    ),
    Key(
        "hcmTIMEOUT",
        int,
        15000,
        "How long the GCM waits for a host to start or stop a queue's processes, in ms.",
        (100, 600000),
        section="Timing",
    ),
    Key(
        "host.loss.grace",
        int,
        6000,
        "How long a host's registration must have been gone (its session expired) before the "
        "leading GCM replaces its exchanges on the other hosts and marks them lost, in ms; its "
        "monitors are re-placed as soon as the registration is gone.",
        (0, 3600000),
        section="Timing",
    ),
    *_ZK_KEYS,
    Key(
        "zk.close.root",
        bool,
        False,
        "For a ZooKeeper that serves this cluster alone (roq up's own, the image's): at start "
        "the GCM gives its root and /zookeeper the cluster's ACL while they are open to all, so "
        "no client without the cluster's credential creates a znode there (docs/security.md "
        "§4). Not for a ZooKeeper shared with other applications or clusters.",
        section="ZooKeeper",
    ),
    *_SECURITY_KEYS,
    *_LOGGING_KEYS,
    Key(
        "formatDB",
        bool,
        False,
        "Wipe the cluster's state in ZooKeeper when this GCM becomes "
        "leader (never before: a standby must not erase a live cluster).",
        section="State",
    ),
    Key(
        "queues.per.principal",
        int,
        100,
        "Most queues a principal may have under its admin grants: past it its queue creations "
        "are refused (forbidden, naming this key). A principal holding admin on every queue "
        "is held to none.",
        (1, 1_000_000),
        section="Security",
    ),
    Key(
        "hasCloudConfiguration",
        bool,
        False,
        "RoQ: whether this GCM writes its cloud configuration to ZooKeeper (/RoQ/cloud). roq's "
        "GCM answers admin command 2009 from its own cloud.* keys and writes none: false; "
        "true is refused at start.",
        section="Cloud",
    ),
    Key(
        "cloud.use",
        bool,
        False,
        "Enable the cloud section (answered by admin command 2009).",
        section="Cloud",
    ),
    Key(
        "cloud.user",
        str,
        "",
        "IaaS user name, answered by admin command 2009. Not a credential: the ec2 provisioner "
        "takes its credentials from the AWS chain (the machine's instance role), never from "
        "this file.",
        section="Cloud",
    ),
    Key("cloud.gateway", str, "", "Gateway given to provisioned VMs.", section="Cloud"),
    Key(
        "cloud.endpoint",
        str,
        "",
        "IaaS endpoint URL. For the ec2 provisioner: empty for the region's public endpoint, an "
        "https:// URL for a VPC endpoint, or http:// on a loopback address for an EC2 emulator.",
        section="Cloud",
    ),
    Key(
        "provisioner",
        str,
        "none",
        "What the GCM does when a queue needs another exchange and no host has a free slot: "
        "none (log that capacity is exhausted and refuse with no_capacity, which the queue's "
        "monitor raises as a KPI alarm) or ec2 (start an instance of cloud.image whose user data "
        "makes it join this cluster as a host). See docs/elasticity.md.",
        choices=("none", "ec2"),
        section="Provisioning",
    ),
    Key(
        "cloud.region",
        str,
        "us-east-1",
        "EC2 region of the ec2 provisioner (the endpoint is the region's own unless "
        "cloud.endpoint is set).",
        section="Provisioning",
    ),
    Key("cloud.image", str, "", "AMI id of the roq machine image (ami/).", section="Provisioning"),
    Key("cloud.instance.type", str, "t3.small", "EC2 instance type.", section="Provisioning"),
    Key("cloud.key.name", str, "", "EC2 key pair name (empty: none).", section="Provisioning"),
    Key(
        "cloud.security.groups",
        str,
        "",
        "Comma-separated security group ids for new instances (empty: the VPC default).",
        section="Provisioning",
    ),
    Key(
        "cloud.instance.profile",
        str,
        "",
        "IAM instance profile (name, or arn:...) given to the instances the ec2 provisioner "
        "starts (empty: none). Passing one needs iam:PassRole on its role (docs/deploy.md).",
        section="Provisioning",
    ),
    Key(
        "cloud.subnet",
        str,
        "",
        "Subnet id for new instances (empty: default).",
        section="Provisioning",
    ),
    Key(
        "cloud.root.device",
        str,
        "/dev/xvda",
        "Root device name of cloud.image (the roq image, built from Debian 12: /dev/xvda). The "
        "ec2 provisioner launches it with that EBS volume encrypted (the account's aws/ebs key); "
        "a wrong name would add a second volume instead, so it must be the image's.",
        section="Provisioning",
    ),
    Key(
        "cloud.root.size",
        int,
        8,
        "Size in GiB of that encrypted root volume, which holds the host's message logs (at least "
        "the image's own size: 8 for the roq image).",
        (1, 16384),
        section="Provisioning",
    ),
    Key(
        "cloud.join.zk",
        str,
        "",
        "ZooKeeper connect string a provisioned host uses (empty: this GCM's zk.servers).",
        section="Provisioning",
    ),
    Key(
        "cloud.join.gcm",
        str,
        "",
        "GCM address a provisioned host is given (empty: this GCM's network.interface).",
        section="Provisioning",
    ),
    Key(
        "cloud.join.interface",
        str,
        "ens5",
        "Interface a provisioned host binds and announces (ROQ_INTERFACE of the image).",
        section="Provisioning",
    ),
    Key(
        "cloud.instances.max",
        int,
        2,
        "Most instances the ec2 provisioner starts during one GCM's leadership.",
        (0, 1000),
        section="Provisioning",
    ),
    Key(
        "cloud.provision.cooldown.ms",
        int,
        300_000,
        "Least time between two instance launches: a booting VM is not asked for twice.",
        (0, 86_400_000),
        section="Provisioning",
    ),
    Key(
        "cloud.request.timeout.ms",
        int,
        10_000,
        "Time limit of connecting to and of each read from the EC2 API, per attempt (a request "
        "is tried at most twice, with the same client token: one instance at most).",
        (100, 600_000),
        section="Provisioning",
    ),
    Key(
        "cloud.cluster.parameter",
        str,
        "",
        "Name of the AWS SSM Parameter Store parameter (SecureString) that holds this cluster's "
        "cluster.json, e.g. /roq/prod/cluster, uploaded once with `roq keys ssm-put`. The ec2 "
        "provisioner gives a new host this name, never the secret; the host fetches the file "
        "with its instance role before it starts (docs/deploy.md). Required by provisioner=ec2 "
        "with security on: a host without the cluster's keys could never join.",
        section="Provisioning",
    ),
)

HCM_KEYS: tuple[Key, ...] = (
    Key(
        "gcm.address",
        str,
        "127.0.0.1",
        "Address of the GCM (RoQ: the GCM the host and its ScalingProcess talk to). A host "
        "registers in ZooKeeper; its monitors' scaling actuators ask the GCM at "
        "gcm.address:gcm.ports.base when ZooKeeper names no leader (or does not answer).",
        section="GCM",
    ),
    Key(
        "gcm.ports.base",
        int,
        5000,
        "ports.base of the GCM at gcm.address (its admin API is gcm.ports.base + 3).",
        (1024, 65529),
        section="GCM",
    ),
    *_ZK_KEYS,
    *_SECURITY_KEYS,
    *_LOGGING_KEYS,
    Key(
        "network.interface",
        str,
        "127.0.0.1",
        "Address this host binds and announces for "
        "itself, its monitors and its exchanges: an IP address or an interface name.",
        section="Ports",
    ),
    Key(
        "host.name",
        str,
        "",
        "Name under which the host registers; empty means the announced address.",
        section="Ports",
    ),
    Key(
        "hcm.port",
        int,
        5100,
        "Port of the host's request socket (RoQ's fixed 5100).",
        PORT,
        section="Ports",
    ),
    Key(
        "hcm.metrics.port",
        int,
        0,
        "Port of the host's HTTP listener on network.interface: GET /metrics (Prometheus: the "
        "host's and its monitors' and exchanges' series), /healthz and /readyz, without "
        "authentication (docs/operations.md, Metrics). 0: no listener. roq up sets it.",
        METRICS_PORT,
        section="Ports",
    ),
    Key(
        "monitor.base.port",
        int,
        5500,
        "First monitor port; each monitor takes 6 consecutive ports from a free list.",
        PORT,
        section="Ports",
    ),
    Key(
        "statmonitor.base.port",
        int,
        5800,
        "First stat-monitor port; each takes 2 (statistics in, KPI stream out).",
        PORT,
        section="Ports",
    ),
    Key(
        "exchange.base.port",
        int,
        6000,
        "First exchange port; each exchange takes 4 (front, back, control, replication).",
        PORT,
        section="Ports",
    ),
    Key(
        "ports.max.perkind",
        int,
        200,
        "Slots scanned above each base port before allocation fails.",
        (1, 5000),
        section="Ports",
    ),
    Key(
        "exchange.max.perhost",
        int,
        0,
        "Exchanges this host may run, all queues together (enforced). 0: derived from the "
        "machine at the host's start, min(8 per core, memory / (log.memory.bytes + 128 MiB)), "
        "at least 8 (the host logs the number and how it came about). A queue keeps "
        "replicationFactor (2) exchanges. RoQ's default was 3.",
        (0, 1000),
        section="Capacity",
    ),
    Key(
        "queue.hcm.vm",
        bool,
        False,
        "RoQ: run the monitor inside the host process (true) or as its own (false). roq runs "
        "every monitor as its own process, supervised by its host: false; true is refused at "
        "start.",
        section="Capacity",
    ),
    Key(
        "exchange.hcm.vm",
        bool,
        False,
        "RoQ: run exchanges as threads of the host (true) or as their own processes (false, "
        "RoQ's shipped value). roq runs every exchange as its own process: false; true is "
        "refused at start.",
        section="Capacity",
    ),
    Key(
        "monitor.stat.period",
        int,
        1000,
        "Period of the statistics that exchanges and the monitor publish, in ms (RoQ: 60000).",
        MS,
        section="Timing",
    ),
    Key(
        "heartbeat.period",
        int,
        500,
        "Exchange heartbeat period in ms; the monitor declares an exchange dead after "
        "monitor.dead.heartbeats (default 3) of its periods of silence.",
        (20, 60000),
        section="Timing",
    ),
    Key(
        "monitor.dead.heartbeats",
        int,
        3,
        "Heartbeat periods of silence after which the monitor declares an exchange dead "
        "(one whose connection is still up is late: dead after 5 s of silence).",
        (2, 100),
        section="Monitor",
    ),
    Key(
        "monitor.list.period",
        int,
        2000,
        "Period in ms at which the monitor republishes the full exchange list to subscribers.",
        MS,
        section="Monitor",
    ),
    Key(
        "exchange.warmup",
        int,
        1000,
        "A new exchange takes publishers once the subscribers already connected to the queue "
        "have joined it (counted by its subscriptions), or after this many ms at the latest "
        "(a subscriber that never joins). The only exchange of a queue takes publishers at once.",
        (0, 600_000),
        section="Monitor",
    ),
    Key(
        "exchange.max.throughput",
        int,
        100_000_000,
        "Payload bytes per second an exchange is sized for (RoQ: 75000000 per minute); the "
        "relocation thresholds below are fractions of it.",
        (1, 10**12),
        section="Monitor",
    ),
    Key(
        "relocate.overload",
        float,
        1.10,
        "An exchange above this fraction of exchange.max.throughput is overloaded (RoQ 1.10).",
        (0.01, 100.0),
        section="Monitor",
    ),
    Key(
        "relocate.target",
        float,
        0.90,
        "A publisher moves to an exchange if it stays below this fraction afterwards (RoQ 0.90).",
        (0.01, 100.0),
        section="Monitor",
    ),
    Key(
        "relocate.optimise",
        float,
        0.20,
        "Or if the move narrows a load gap wider than this fraction of the source (RoQ 0.20).",
        (0.0, 1.0),
        section="Monitor",
    ),
    Key(
        "relocate.coldstart",
        float,
        0.10,
        "While every exchange is below this fraction, publishers are spread by count (RoQ 0.10).",
        (0.0, 1.0),
        section="Monitor",
    ),
    Key(
        "relocate.producers.max",
        int,
        3,
        "Most active publishers moved off one overloaded exchange per decision (RoQ: 1).",
        (1, 1000),
        section="Monitor",
    ),
    Key(
        "relocate.hysteresis",
        int,
        2,
        "Consecutive overloaded reports before the monitor moves publishers.",
        (1, 1000),
        section="Monitor",
    ),
    Key(
        "relocate.cooldown",
        int,
        5000,
        "Ms after a relocation during which the same exchange is not relieved again.",
        (0, 3_600_000),
        section="Monitor",
    ),
    Key(
        "exchange.subscriber.hwm",
        int,
        1000,
        "Batches queued per subscriber connection; past it that subscriber's batches are "
        "dropped by ZeroMQ and the subscriber sees a sequence gap (never the exchange growing).",
        (1, 10_000_000),
        section="Exchange",
    ),
    Key(
        "exchange.publisher.hwm",
        int,
        100,
        "Batches queued per publisher connection before TCP back-pressure stops the publisher "
        "(each up to a batch of memory in the exchange: 100 was as fast as 1000 and kept the "
        "exchange's peak 55 MB lower, docs/benchmarks.md §5).",
        (1, 10_000_000),
        section="Exchange",
    ),
    Key(
        "dedup.window.ms",
        int,
        120_000,
        'De-duplication by message id (docs/guarantees.md, "De-duplication by message id"): '
        "an exchange does not append a batch whose every record carries a message id it "
        "appended, or copied from another exchange's log, within this many ms (the publisher "
        "is acknowledged, the records counted in roq_exchange_duplicates_total). At most "
        "dedup_window_ids_max ids per exchange. A consumer group does not hand out a copy of "
        "an id its consumers read at another place within it either (roq_group_duplicates_total; "
        "at most work_dedup_ids_max ids per group). 0: off.",
        (0, 86_400_000),
        section="Exchange",
    ),
    Key(
        "useLog",
        bool,
        True,
        "Append every message to the message log (the thesis's MLS).",
        section="Message log",
    ),
    Key(
        "directory",
        str,
        "roq-data/log",
        "Root directory of the message logs (and of the HTTP gateway's snapshots, .http-PORT).",
        section="Message log",
    ),
    Key(
        "maxFileSize",
        int,
        64 * 1024 * 1024,
        "Roll to a new segment file once the current "
        "one exceeds this many bytes (the thesis used 5000000).",
        (1024, 2**40),
        section="Message log",
    ),
    Key(
        "replicationFactor",
        int,
        2,
        "Copies of each exchange's log, the leader included (1 = no replication).",
        (1, 16),
        section="Message log",
    ),
    Key(
        "min.insync.copies",
        int,
        0,
        "Copies of a log, the leader included, that must be in sync for acks=all to confirm "
        "(Kafka's min.insync.replicas). With fewer, acks=all waits, then refuses with a "
        "retriable error naming the copies missing; it never confirms on fewer. 0: "
        "replicationFactor. A queue keeps at least replicationFactor exchanges and log "
        "followers together, so that there is a copy to hold.",
        (0, 16),
        section="Message log",
    ),
    Key(
        "log.followers",
        int,
        0,
        "Log followers each queue keeps: processes on hosts without the queue's exchanges "
        "that hold copies of its logs and take no publishers or subscribers (at most "
        "replicationFactor - 1 count). Copies go to them first; the queue then keeps at least "
        "max(1, replicationFactor - log.followers) exchanges, down to which it scales in, and "
        "every log still has replicationFactor copies on as many hosts. 0: copies live in "
        "the queue's exchanges, of which it keeps replicationFactor.",
        (0, 15),
        section="Message log",
    ),
    Key(
        "log.flush",
        str,
        "interval",
        "When appended batches are forced to disk: every-batch (fdatasync before the append "
        "returns; survives power loss), interval (every log.flush.interval.ms; a power loss "
        "loses at most that window), os (the kernel writes back; survives a crash of the "
        "exchange, not of the machine). See docs/log-format.md.",
        choices=("every-batch", "interval", "os"),
        section="Message log",
    ),
    Key(
        "log.flush.interval.ms",
        int,
        200,
        "Flush period of the interval policy, in ms.",
        (1, 3_600_000),
        section="Message log",
    ),
    Key(
        "log.retention.bytes",
        int,
        0,
        "Keep at least this many bytes of each log, deleting older whole segments (0 = no limit).",
        (0, 2**62),
        section="Message log",
    ),
    Key(
        "log.retention.ms",
        int,
        0,
        "Delete a closed segment once its newest batch is older than this many ms (0 = never).",
        (0, 2**62),
        section="Message log",
    ),
    Key(
        "log.retention.records",
        int,
        0,
        "Keep at least this many records of each log, deleting older whole segments "
        "(0 = no limit; mq's fixed-size queue).",
        (0, 2**62),
        section="Message log",
    ),
    Key(
        "log.memory.bytes",
        int,
        64 * 1024 * 1024,
        "Size of the memory log: the most recent batches of each exchange's own log kept in "
        "memory to serve replays of the tail without disk reads (0 = off). Copies of other "
        "exchanges' logs have none: they are read only once their leader is dead.",
        (0, 2**40),
        section="Message log",
    ),
    Key(
        "scaling.policy",
        str,
        "default",
        "Scaling policy of each queue's monitor: default (scale out when a rule fires, in when "
        "the load stays under the low-water mark) or null (never; RoQ's behaviour).",
        choices=("default", "null"),
        section="Scaling",
    ),
    Key(
        "scaling.window.ms",
        int,
        2000,
        "Rules are evaluated on exchange rates averaged over this many ms.",
        (10, 3_600_000),
        section="Scaling",
    ),
    Key(
        "scaling.cooldown.ms",
        int,
        10_000,
        "After a scale-out or scale-in, no other one for this many ms.",
        (0, 86_400_000),
        section="Scaling",
    ),
    Key(
        "scaling.highwater",
        float,
        0.9,
        "With no rule stored for a queue: scale out when every exchange carries more than this "
        "fraction of exchange.max.throughput.",
        (0.001, 100.0),
        section="Scaling",
    ),
    Key(
        "scaling.lowwater",
        float,
        0.3,
        "Scale in when the queue's load would fit in one exchange fewer, each below this "
        "fraction of its capacity (the exchange rule's limit, else highwater x max throughput).",
        (0.0, 1.0),
        section="Scaling",
    ),
    Key(
        "scaling.lowwater.ms",
        int,
        30_000,
        "... continuously for this many ms.",
        (0, 86_400_000),
        section="Scaling",
    ),
    Key(
        "scaling.min.exchanges",
        int,
        1,
        "Scale-in never leaves a queue with fewer exchanges than this.",
        (1, 1000),
        section="Scaling",
    ),
    Key(
        "scaling.max.exchanges",
        int,
        0,
        "Scale-out never gives a queue more exchanges than this (0: as many as hosts allow).",
        (0, 1000),
        section="Scaling",
    ),
    Key(
        "scaling.rules.refresh.ms",
        int,
        30_000,
        "The monitor re-reads its queue's rules (2007) and re-registers for updates (2008) this "
        "often, so a GCM fail-over does not leave it with stale rules.",
        (100, 86_400_000),
        section="Scaling",
    ),
    # --- the HTTP gateway (`roq http`, roq/http/): the mq seed's keys keep its names ---------
    Key(
        "http.enabled",
        bool,
        True,
        "Whether `roq up` starts the HTTP gateway, and whether `roq http --if-enabled` (the "
        "systemd unit roq-http) serves or exits 0 at once.",
        section="HTTP gateway",
    ),
    Key(
        "http.port",
        int,
        8080,
        "Port of the HTTP gateway (the mq API v1 and v2, /metrics) on network.interface.",
        PORT,
        section="HTTP gateway",
    ),
    Key(
        "http.queues",
        int,
        1,
        "roq queues that hold the gateway's messages; a topic is a routing key of one of them "
        "(by a hash of its name). More queues spread the load over more exchanges.",
        (1, 64),
        section="HTTP gateway",
    ),
    Key(
        "http.acks",
        str,
        "leader",
        "What a publish waits for before its 200: the exchange appended the messages to its log "
        "(leader) or also every in-sync replica did (all).",
        choices=("leader", "all"),
        section="HTTP gateway",
    ),
    Key(
        "http.tls.cert",
        str,
        "",
        "PEM file of the gateway's TLS certificate (its chain after it). With http.tls.key the "
        "gateway serves HTTPS only; both empty: plain HTTP (then put TLS in front of it).",
        section="HTTP gateway",
    ),
    Key(
        "http.tls.key",
        str,
        "",
        "PEM file of that certificate's private key, unencrypted (keep it mode 0600).",
        section="HTTP gateway",
    ),
    Key(
        "maxQueueSize",
        int,
        10_000,
        "Messages a topic keeps; a publish beyond them evicts the oldest (mq seed).",
        (1, 10_000_000),
        section="HTTP gateway",
    ),
    Key(
        "maxNameLen",
        int,
        100,
        "Longest topic, owner or subscriber name, in characters (mq seed).",
        (1, 1000),
        section="HTTP gateway",
    ),
    Key(
        "maxMsgSize",
        int,
        131_072,
        "Largest message, in bytes of its UTF-8 text (mq seed: 128 KiB).",
        (1, 4_000_000),
        section="HTTP gateway",
    ),
    Key(
        "maxTopics",
        int,
        10_000,
        "Most topics the cluster's gateways register (mq seed).",
        (1, 10_000_000),
        section="HTTP gateway",
    ),
    Key(
        "maxSubscribers",
        int,
        10_000,
        "Most subscribers of one topic (mq seed).",
        (1, 10_000_000),
        section="HTTP gateway",
    ),
    Key(
        "http.topics.per.principal",
        int,
        1_000,
        "Most topics one principal registers, through every gateway together: past it its "
        "registrations are 403 while others' go on (maxTopics is the cluster's). A principal "
        "holding admin on every topic (topic:*) is held to none.",
        (1, 10_000_000),
        section="HTTP gateway",
    ),
    Key(
        "http.requests.per.principal",
        int,
        limits.http_principal_requests_max,
        "Requests one principal has in progress on one gateway (long polls included): past "
        "it a 429. At most the gateway's own bound, 2000.",
        (1, limits.http_requests_max),
        section="HTTP gateway",
    ),
    Key(
        "http.publish.bytes.per.principal",
        int,
        16 * 1024 * 1024,
        "Message bytes one principal publishes per second on one gateway, averaged (a batch "
        "may borrow ahead, then its next publishes wait): past it a 429 with Retry-After. "
        "0: no bound. A principal holding admin on every topic is held to none.",
        (0, 1 << 40),
        section="HTTP gateway",
    ),
    Key(
        "http.cache.bytes",
        int,
        256 * 1024 * 1024,
        "Memory one gateway holds messages' text and meta in (the least recently used go "
        "first); a get of a message not held reads it back from its log. Each kept message "
        "also costs about 100 bytes of place (its exchange and offset). 0: none held.",
        (0, 1 << 40),
        section="HTTP gateway",
    ),
    Key(
        "work.slot.messages",
        int,
        1000,
        "Work queues (consumer groups): an exchange closes a slot of its log after this many "
        "messages; the slot is what a group leases to one consumer at a time.",
        (1, 1_000_000),
        section="Work queues",
    ),
    Key(
        "work.slot.ms",
        int,
        500,
        "... or once the open slot's first message was seen this many ms ago by the monitor "
        "(so a slow trickle is consumed too); at once when a consumer is waiting for a slot.",
        MS,
        section="Work queues",
    ),
    Key(
        "work.lease.ms",
        int,
        30_000,
        "A slot leased to a consumer goes back to the group if the consumer shows no progress "
        "(ack, nack, in_progress, any request on it) for this many ms: the visibility timeout.",
        (100, 86_400_000),
        section="Work queues",
    ),
    Key(
        "work.inflight",
        int,
        1000,
        "Messages one consumer may hold handed out and not settled (ack, nack, reject); at the "
        "limit it is told (a log line and its statistics) and receives no more until it settles.",
        (1, 1_000_000),
        section="Work queues",
    ),
    Key(
        "work.redelivery.backoff.ms",
        int,
        1000,
        "A message nacked without a delay, or whose lease expired, is handed out again no sooner "
        "than this many ms x its delivery count (capped at 60 s).",
        (0, 86_400_000),
        section="Work queues",
    ),
    Key(
        "work.max.deliveries",
        int,
        5,
        "A message handed out this many times without an ack goes to its group's dead-letter "
        "queue instead of a sixth delivery.",
        (1, 1000),
        section="Work queues",
    ),
    Key(
        "request.delegator.repeats",
        int,
        3,
        "Request queues (roq call/serve), per-queue default (JLupin repeatsAmountByDelegator): "
        "how many times the monitor looks for a worker of a task's service, waiting "
        'request.delegator.wait.ms between looks, before the task ends "no worker".',
        (1, 1000),
        section="Request queues",
    ),
    Key(
        "delivery.state",
        str,
        "log",
        "Where a queue's monitor keeps its delivery state, the request/response task records, "
        "the consumer groups' slots and the HTTP gateway's topics (read by roq http too: every "
        "gateway must have the same): log (its own state log, copied to replicationFactor - "
        "1 exchanges and read back by a monitor re-placed after a host loss: no ZooKeeper write "
        "per task or ack; docs/architecture.md §12) or zookeeper (a znode per task, per "
        "slot and per topic and subscriber, as before 26 Nov).",
        choices=("zookeeper", "log"),
        section="Request queues",
    ),
    Key(
        "request.delegator.wait.ms",
        int,
        1000,
        "(JLupin timeToWaitBetweenRepeatProbeInMillisByDelegator) the wait between those looks.",
        MS,
        section="Request queues",
    ),
    Key(
        "request.send.probes",
        int,
        3,
        "(JLupin maxSendProbeAmount) runs of a task started (a worker that died with it counts) "
        'before it ends "failed" without another run.',
        (1, 1000),
        section="Request queues",
    ),
    Key(
        "request.retry.pattern",
        str,
        "",
        "(JLupin exceptionStringToRepeat) a regular expression: an error that it finds (re.search) "
        "runs the task again, up to request.retry.max times; empty: no error is retried.",
        section="Request queues",
    ),
    Key(
        "request.retry.max",
        int,
        3,
        "(JLupin maxAcceptExceptionAmount) runs again after matching errors, at most.",
        (0, 1000),
        section="Request queues",
    ),
    Key(
        "request.input.ttl.ms",
        int,
        300_000,
        "(JLupin howLongTaskInputShouldBeOnQueueWithoutResultItInMillis) a task without a result "
        'this long after it was accepted ends "expired".',
        MS,
        section="Request queues",
    ),
    Key(
        "request.result.ttl.ms",
        int,
        600_000,
        "(JLupin howLongTaskResultShouldBeOnQueueWithoutDownloadingItInMillis) a result not "
        "fetched and acknowledged this long after it was stored is collected; the task then "
        'answers "expired".',
        MS,
        section="Request queues",
    ),
    Key(
        "request.delay.ms",
        int,
        0,
        "(JLupin delaySendProcessTaskToExecuteInMillis) no task runs sooner than this many ms "
        "after it was accepted.",
        (0, 86_400_000),
        section="Request queues",
    ),
    Key(
        "request.gc.period.ms",
        int,
        500,
        "(JLupin waitTimeBetweenCheckingTaskByGarbageManagerInMillis) the wait between two "
        "passes of the queue's task collector, which applies the deadlines above to at most "
        "200 task records per pass (limits.task_gc_batch).",
        (10, 86_400_000),
        section="Request queues",
    ),
    Key(
        "request.transient.ms",
        int,
        0,
        "(JLupin howLongTaskStatusWillBeInATransientStateInMillis) a task still accepted, never "
        "started by a worker, this many ms after it was accepted or last retried ends expired: "
        "a request whose message never reached the log (its requester died between the claim "
        "and the publish, or a worker between a retry and its new publish) ends then rather "
        "than at request.input.ttl.ms. Keep it above the wait for a worker behind a backlog "
        "and above request.delay.ms. 0: off.",
        (0, 86_400_000),
        section="Request queues",
    ),
    Key(
        "request.worker.repeats",
        int,
        1200,
        "(JLupin repeatsAmount) a worker (roq serve, Worker) asks the queue's monitor at most "
        "this many times to take each of its requests (start, renewal, its outcome), "
        "request.worker.wait.ms apart and for at most repeats x wait (the default: 30 s), while "
        "the monitor does not answer, is busy or moves; read by the worker when it starts.",
        (1, 1_000_000),
        section="Request queues",
    ),
    Key(
        "request.worker.wait.ms",
        int,
        25,
        "(JLupin timeToWaitBetweenRepeatProbeInMillis) the worker's wait between those asks.",
        (1, 60_000),
        section="Request queues",
    ),
    Key(
        "request.delegator.check.ms",
        int,
        0,
        "(JLupin howOftenCheckingServerInMillisByDelegator) a worker counts as available to "
        'the "no worker" looks if its consumer was heard from within this many ms (or holds a '
        "slot); 0: within work.lease.ms.",
        (0, 86_400_000),
        section="Request queues",
    ),
)


# Declared and validated, so that RoQ's and the thesis's files still load, but read by no
# component (docs/configuration.md, "Keys with one value roq honours"). Every other key is read by
# one of the dataclasses of `components.py`; tests/unit/test_config.py checks both.
# Keys roq no longer reads, with what to do instead. A file (or -D) that gives one a value is
# refused at start with this text, naming the key and never its value (it may be a secret); an
# empty one, as in the GCM.properties shipped before, is ignored with a warning so that an
# upgrade with an old file still starts.
RETIRED: dict[str, str] = {
    "cloud.password": "roq reads no cloud secret from a file: the ec2 provisioner takes its "
    "credentials from the AWS chain (environment, ~/.aws, the machine's instance role). Give "
    "the GCM machine an IAM instance role (docs/deploy.md) and delete this line",
    # RoQ's and the thesis's keys that roq cannot honour (issue 34): refused, not ignored
    "exchange.vm.heap": "it set the JVM heap (-Xmx) of RoQ's exchange processes, and roq's "
    "exchanges run no JVM: an exchange's memory is bounded by log.memory.bytes (its memory "
    "log) and a host's exchanges by exchange.max.perhost. Delete this line",
    "duration": "the thesis's HCM.properties (seed 004, CODE 5.2) set it without saying what it "
    "meant, so roq cannot honour it: a log's retention is log.retention.ms and "
    "log.retention.bytes, its flushing log.flush. Delete this line",
}

# Values roq refuses although the key is RoQ's: the key's other value is what roq always does
# (issue 34: a value asking for what roq cannot do stops the start, naming key and why).
REFUSED_VALUES: dict[str, tuple[Value, str]] = {
    "hasCloudConfiguration": (True, "roq's GCM writes no cloud configuration to ZooKeeper: "
                              "every GCM answers admin command 2009 from its own cloud.* keys "
                              "(give each GCM the same file); set it to false"),
    "queue.hcm.vm": (True, "roq runs each monitor as its own process, which its host "
                     "supervises and restarts, never inside the host; set it to false"),
    "exchange.hcm.vm": (True, "roq runs each exchange as its own process (its own log, "
                        "restarted alone), never as a thread of the host; set it to false"),
}  # fmt: skip

NOT_READ = frozenset(
    {
        "hasCloudConfiguration",
        # RoQ's, with the one value roq honours (false); true is refused (REFUSED_VALUES)
        "queue.hcm.vm",
        "exchange.hcm.vm",
    }
)


def render_value(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def render(keys: Iterable[Key], title: str) -> str:
    """The documented properties file for a key table (what `config/*.properties` holds)."""
    out = [
        f"# {title}",
        "#",
        "# Every key roq reads, with its default. A missing key takes its default;",
        "# an invalid value stops the process with exit code 78.",
        "",
    ]
    section = None
    for key in keys:
        if key.section != section:
            section = key.section
            out += [f"# --- {section} " + "-" * max(3, 70 - len(section)), ""]
        for line in _wrap(key.doc):
            out.append(f"# {line}")
        if key.bounds is not None:
            out.append(f"# Range: {_fmt(key.bounds[0])} .. {_fmt(key.bounds[1])}.")
        if key.choices:
            out.append(f"# One of: {', '.join(key.choices)}.")
        out.append(f"{key.name}={render_value(key.default)}")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _wrap(text: str, width: int = 96) -> list[str]:
    lines: list[str] = []
    current = ""
    for word in text.split():
        if current and len(current) + 1 + len(word) > width:
            lines.append(current)
            current = word
        else:
            current = f"{current} {word}".strip()
    if current:
        lines.append(current)
    return lines
