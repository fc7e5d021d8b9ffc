"""Each component's settings: read once, at its start, into a frozen dataclass with units converted.

No code outside this package looks a key up by name. A component calls its dataclass's
`from_settings` when it starts, so a misspelled key fails that start (and
tests/unit/test_config.py, which checks that every key read here is declared in `keys.py` and
that every declared key is read here or listed in `keys.NOT_READ`), never a hot path. Units are in
the field names: durations become seconds (`_s`, float) unless the consumer takes milliseconds
(`_ms`, int). Each field names its key (`field(metadata=key(…))`) and `read` turns the keys into
the fields by their type and unit, so the rule is applied in one place.

The pure packages keep their own types and never read keys: the log's `LogSettings` is built here
by `log_settings`.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from roq import limits
from roq.config.keys import HCM_KEYS
from roq.config.loader import Settings
from roq.errors import ConfigError
from roq.log import FlushPolicy, LogSettings, Retention

_SAFE = re.compile(r"^[A-Za-z0-9.,:_\-]*$")  # what ami/files/roq-configure accepts in role.env
# An SSM parameter name (AWS's rule; roq-configure accepts the same for ROQ_CLUSTER_PARAMETER)
_PARAMETER = re.compile(r"^[A-Za-z0-9_.\-/]+$")
_DEVICE = re.compile(r"^/dev/[a-z0-9]+$")  # an EC2 block device name (/dev/xvda, /dev/sda1)
_T = TypeVar("_T")


def key(name: str) -> dict[str, str]:
    """A field's metadata: `read` fills the field from key `name` (`field(metadata=key(…))`)."""
    return {"key": name}


def read(cls: type[_T], settings: Settings, **given: Any) -> _T:
    """An instance of the dataclass `cls`: each field declared with `key` read from `settings`
    by its type, and in seconds when its name ends in `_s` (the key is in milliseconds); each
    field typed with a dataclass of this module from that class's `from_settings`; the rest
    (what a key does not give as it is) from `given`."""
    values = dict(given)
    for item in fields(cls):  # type: ignore[arg-type]
        if item.name in values:
            continue
        name = item.metadata.get("key")
        if name is None:
            values[item.name] = globals()[str(item.type)].from_settings(settings)
        elif item.name.endswith("_s"):
            values[item.name] = settings._seconds(name)
        else:
            values[item.name] = _READERS[str(item.type)](settings, name)
    return cls(**values)


_READERS = {
    "int": Settings._int,
    "float": Settings._float,
    "bool": Settings._bool,
    "str": Settings._str,
}


# --- shared by several components ------------------------------------------------------------
@dataclass(frozen=True)
class ZooKeeperSettings:
    servers: str = field(metadata=key("zk.servers"))  # a connect string
    namespace: str = field(metadata=key("zk.namespace"))  # the cluster's root znode
    session_timeout_ms: int = field(metadata=key("zk.session.timeout"))

    @classmethod
    def from_settings(cls, settings: Settings) -> ZooKeeperSettings:
        return read(cls, settings)


@dataclass(frozen=True)
class GcmAddress:
    """`gcm.address` and `gcm.ports.base` (HCM.properties, RoQ's): the GCM a monitor's scaling
    actuator asks when ZooKeeper names no leader (RoQ's ScalingProcess was given it)."""

    address: str = field(metadata=key("gcm.address"))
    ports_base: int = field(metadata=key("gcm.ports.base"))

    @classmethod
    def from_settings(cls, settings: Settings) -> GcmAddress:
        return read(cls, settings)


@dataclass(frozen=True)
class SecuritySettings:
    enabled: bool = field(metadata=key("security"))
    directory: str = field(metadata=key("security.dir"))  # cluster.json and admin.json
    zk_tls: bool = field(metadata=key("zk.tls"))  # TLS to ZooKeeper when cluster.json has it
    # the HTTP gateway's queues, <prefix>-N, are the cluster's (protocol/principals.py)
    gateway_queue_prefix: str = field(metadata=key("http.queue.prefix"))

    @classmethod
    def from_settings(cls, settings: Settings) -> SecuritySettings:
        return read(cls, settings)


@dataclass(frozen=True)
class LoggingSettings:
    """How a daemon writes its log lines; read by every daemon command (roq.cli.daemons)."""

    format: str = field(metadata=key("log.format"))  # text | json

    @classmethod
    def from_settings(cls, settings: Settings) -> LoggingSettings:
        return read(cls, settings)


def log_settings(settings: Settings) -> LogSettings:
    """The log keys of an HCM.properties (maxFileSize, log.*), as the log package's own type."""
    return LogSettings(
        max_file_size=settings._int("maxFileSize"),
        flush=FlushPolicy.parse(settings._str("log.flush"), settings._int("log.flush.interval.ms")),
        retention=Retention(
            bytes=settings._int("log.retention.bytes"),
            ms=settings._int("log.retention.ms"),
            records=settings._int("log.retention.records"),
        ),
        memory_bytes=settings._int("log.memory.bytes"),
    )


# --- the GCM (GCM.properties) --------------------------------------------------------------------
@dataclass(frozen=True)
class CloudSettings:
    """RoQ's cloud section, answered by admin command 2009. It holds no secret (`keys.RETIRED`)."""

    use: bool = field(metadata=key("cloud.use"))
    user: str = field(metadata=key("cloud.user"))
    endpoint: str = field(metadata=key("cloud.endpoint"))
    gateway: str = field(metadata=key("cloud.gateway"))

    @classmethod
    def from_settings(cls, settings: Settings) -> CloudSettings:
        return read(cls, settings)


@dataclass(frozen=True)
class Ec2Config:
    """The ec2 provisioner's settings (roq.gcm.provisioning), checked when they are read.

    No credential is among them: boto3 finds its own (the AWS chain), and a GCM.properties that
    still sets `cloud.password` is refused by the loader (`keys.RETIRED`)."""

    region: str = field(metadata=key("cloud.region"))
    # empty: boto3's endpoint for the region; else a VPC endpoint or an emulator
    endpoint: str = field(metadata=key("cloud.endpoint"))
    image: str = field(metadata=key("cloud.image"))
    instance_type: str = field(metadata=key("cloud.instance.type"))
    # IAM instance profile of new instances (name or ARN); empty: none
    instance_profile: str = field(metadata=key("cloud.instance.profile"))
    key_name: str = field(metadata=key("cloud.key.name"))
    security_groups: tuple[str, ...]  # cloud.security.groups, split at commas
    subnet: str = field(metadata=key("cloud.subnet"))
    root_device: str = field(metadata=key("cloud.root.device"))  # encrypted at launch
    root_size_gib: int = field(metadata=key("cloud.root.size"))
    join_zk: str  # cloud.join.zk, else zk.servers
    join_namespace: str = field(metadata=key("zk.namespace"))
    join_gcm: str  # cloud.join.gcm, else network.interface
    join_interface: str = field(metadata=key("cloud.join.interface"))
    gcm_ports_base: int = field(metadata=key("ports.base"))
    instances_max: int = field(metadata=key("cloud.instances.max"))
    cooldown_s: float = field(metadata=key("cloud.provision.cooldown.ms"))
    timeout_s: float = field(metadata=key("cloud.request.timeout.ms"))
    # the SSM parameter holding cluster.json; the host fetches it
    cluster_parameter: str = field(metadata=key("cloud.cluster.parameter"))
    # then a host needs the cluster's keys, so the parameter above
    secured: bool = field(metadata=key("security"))

    @classmethod
    def from_settings(cls, settings: Settings) -> Ec2Config:
        groups = settings._str("cloud.security.groups").split(",")
        config = read(
            cls,
            settings,
            security_groups=tuple(g.strip() for g in groups if g.strip()),
            join_zk=settings._str("cloud.join.zk") or settings._str("zk.servers"),
            join_gcm=settings._str("cloud.join.gcm") or settings._str("network.interface"),
        )
        config.check(settings.source)
        return config

    def check(self, where: str) -> None:
        """Refuse at start-up what would make a broken launch later."""
        for key, value in (("cloud.image", self.image), ("cloud.region", self.region)):
            if not value:
                raise ConfigError(f"{where}: provisioner=ec2 needs key '{key}'")
        if not _DEVICE.match(self.root_device):
            raise ConfigError(
                f"{where}: key 'cloud.root.device' has value {self.root_device!r}: must be a "
                "device name such as /dev/xvda (the root device of cloud.image)"
            )
        if self.endpoint and not api_endpoint(self.endpoint):
            raise ConfigError(
                f"{where}: key 'cloud.endpoint' has value {self.endpoint!r}: must be empty (the "
                "region's endpoint), an https:// URL, or http:// on a loopback address (an "
                "emulator on this machine)"
            )
        if self.join_namespace != "/roq":
            raise ConfigError(
                f"{where}: key 'zk.namespace' is {self.join_namespace!r}: a provisioned host "
                "joins /roq (the image's roq-configure has no namespace setting)"
            )
        for key, value in (
            ("cloud.join.zk", self.join_zk),
            ("cloud.join.gcm", self.join_gcm),
            ("cloud.join.interface", self.join_interface),
        ):
            if not value or not _SAFE.match(value):
                raise ConfigError(
                    f"{where}: key '{key}' has value {value!r}: a provisioned host needs it, "
                    "made of letters, digits and .:,_- only (the image's roq-configure rule)"
                )
        self._check_parameter(where)

    def _check_parameter(self, where: str) -> None:
        if self.cluster_parameter:
            check_parameter_name(self.cluster_parameter, f"{where}: key 'cloud.cluster.parameter'")
        elif self.secured:
            # without it a launched host generates keys of its own and ZooKeeper refuses it
            raise ConfigError(
                f"{where}: provisioner=ec2 with security on needs key 'cloud.cluster.parameter': "
                "the hosts it launches fetch the cluster's cluster.json from that SSM parameter "
                "(upload it with `roq keys ssm-put NAME`); without it they could never join"
            )


def check_parameter_name(name: str, what: str) -> str:
    """`name` if it is a name SSM Parameter Store accepts, else ConfigError naming `what`."""
    if not name or len(name) > limits.ssm_parameter_name_chars_max or not _PARAMETER.match(name):
        raise ConfigError(
            f"{what} has value {name[:80]!r}: an SSM parameter name is 1 to "
            f"{limits.ssm_parameter_name_chars_max} letters, digits and _.-/ "
            "(e.g. /roq/prod/cluster)"
        )
    if "/" in name and not name.startswith("/"):
        raise ConfigError(f"{what} has value {name[:80]!r}: a name with a path starts with /")
    return name


def api_endpoint(url: str) -> bool:
    """https:// anywhere; plain http:// only to this machine, where nothing can listen in."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # e.g. an unclosed [ of an IPv6 address
        return False
    if not parts.netloc or parts.query or parts.fragment:
        return False
    if parts.scheme == "https":
        return True
    return parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class ProvisioningSettings:
    provisioner: str  # "none" or "ec2"
    ec2: Ec2Config | None  # read and checked only when the provisioner is ec2

    @classmethod
    def from_settings(cls, settings: Settings) -> ProvisioningSettings:
        provisioner = settings._str("provisioner")
        ec2 = Ec2Config.from_settings(settings) if provisioner == "ec2" else None
        return cls(provisioner, ec2)


@dataclass(frozen=True)
class GcmSettings:
    # an address or an interface name, resolved when bound
    interface: str = field(metadata=key("network.interface"))
    ports_base: int = field(metadata=key("ports.base"))
    broadcast_period_s: float = field(metadata=key("period"))
    # one request to a host (the Requester takes ms)
    host_timeout_ms: int = field(metadata=key("hcmTIMEOUT"))
    # a host gone this long has its work re-placed
    host_loss_grace_s: float = field(metadata=key("host.loss.grace"))
    format_db: bool = field(metadata=key("formatDB"))
    metrics_port: int = field(metadata=key("metrics.port"))  # 0: no listener
    # queues one principal may administer (issue 31, finding 7: gcm/access.py)
    queues_quota: int = field(metadata=key("queues.per.principal"))
    zk: ZooKeeperSettings
    zk_close_root: bool = field(metadata=key("zk.close.root"))  # this cluster owns its ZooKeeper
    cloud: CloudSettings
    provisioning: ProvisioningSettings

    security: SecuritySettings

    @classmethod
    def from_settings(cls, settings: Settings) -> GcmSettings:
        return read(cls, settings)


# --- the host and its children (HCM.properties) -------------------------------------------------
@dataclass(frozen=True)
class HostSettings:
    # an address or an interface name, resolved at start
    interface: str = field(metadata=key("network.interface"))
    name: str = field(metadata=key("host.name"))  # empty: the announced address
    hcm_port: int = field(metadata=key("hcm.port"))
    metrics_port: int = field(metadata=key("hcm.metrics.port"))  # 0: no listener
    monitor_base_port: int = field(metadata=key("monitor.base.port"))
    stat_base_port: int = field(metadata=key("statmonitor.base.port"))
    exchange_base_port: int = field(metadata=key("exchange.base.port"))
    ports_per_kind_max: int = field(metadata=key("ports.max.perkind"))
    exchanges_max: int = field(metadata=key("exchange.max.perhost"))  # 0: from the machine
    memory_log_bytes: int = field(metadata=key("log.memory.bytes"))  # each exchange's (capacity)
    zk: ZooKeeperSettings
    use_log: bool = field(metadata=key("useLog"))
    # the queues' logs and the copies of other exchanges' logs
    log_root: str = field(metadata=key("directory"))
    # Every value that differs from its default, as (key, text): a child (monitor, exchange)
    # gets them as -D options, so it runs with its host's settings without reading its file.
    child_overrides: tuple[tuple[str, str], ...]

    security: SecuritySettings

    @classmethod
    def from_settings(cls, settings: Settings) -> HostSettings:
        return read(
            cls,
            settings,
            child_overrides=tuple(settings.changed(HCM_KEYS).items()),
        )


@dataclass(frozen=True)
class WorkSettings:
    """Work queues: the consumer groups' slot manager in each queue's monitor."""

    # the exchange cuts its log's slots by count
    slot_messages: int = field(metadata=key("work.slot.messages"))
    slot_s: float = field(metadata=key("work.slot.ms"))  # the monitor closes a slot open this long
    lease_s: float = field(metadata=key("work.lease.ms"))
    inflight: int = field(metadata=key("work.inflight"))
    backoff_s: float = field(metadata=key("work.redelivery.backoff.ms"))
    max_deliveries: int = field(metadata=key("work.max.deliveries"))
    # a group hands out a message id once within this window (monitor/groupids.py); 0: off
    dedup_window_ms: int = field(default=0, metadata=key("dedup.window.ms"))

    @classmethod
    def from_settings(cls, settings: Settings) -> WorkSettings:
        return read(cls, settings)


# The request settings: the key of each field, and JLupin's name for it (docs/requests.md).
REQUEST_KEYS = {
    "repeats": ("request.delegator.repeats", "repeatsAmountByDelegator"),
    "repeat_wait_s": (
        "request.delegator.wait.ms", "timeToWaitBetweenRepeatProbeInMillisByDelegator"
    ),
    "send_probes": ("request.send.probes", "maxSendProbeAmount"),
    "retry_pattern": ("request.retry.pattern", "exceptionStringToRepeat"),
    "retry_max": ("request.retry.max", "maxAcceptExceptionAmount"),
    "input_ttl_s": (
        "request.input.ttl.ms", "howLongTaskInputShouldBeOnQueueWithoutResultItInMillis"
    ),
    "result_ttl_s": (
        "request.result.ttl.ms", "howLongTaskResultShouldBeOnQueueWithoutDownloadingItInMillis"
    ),
    "delay_s": ("request.delay.ms", "delaySendProcessTaskToExecuteInMillis"),
    "transient_s": (
        "request.transient.ms", "howLongTaskStatusWillBeInATransientStateInMillis"
    ),
    "gc_period_s": (
        "request.gc.period.ms", "waitTimeBetweenCheckingTaskByGarbageManagerInMillis"
    ),
    "worker_repeats": ("request.worker.repeats", "repeatsAmount"),
    "worker_wait_s": ("request.worker.wait.ms", "timeToWaitBetweenRepeatProbeInMillis"),
    "check_s": ("request.delegator.check.ms", "howOftenCheckingServerInMillisByDelegator"),
}  # fmt: skip


@dataclass(frozen=True)
class RequestSettings:
    """Request queues: a queue's monitor keeps its tasks (monitor/tasks.py). The HCM's values are
    every queue's defaults; `roq task config QUEUE KEY=VALUE` overrides them per queue."""

    repeats: int = field(metadata=key("request.delegator.repeats"))
    repeat_wait_s: float = field(metadata=key("request.delegator.wait.ms"))
    send_probes: int = field(metadata=key("request.send.probes"))
    retry_pattern: str = field(metadata=key("request.retry.pattern"))
    retry_max: int = field(metadata=key("request.retry.max"))
    input_ttl_s: float = field(metadata=key("request.input.ttl.ms"))
    result_ttl_s: float = field(metadata=key("request.result.ttl.ms"))
    delay_s: float = field(metadata=key("request.delay.ms"))
    transient_s: float = field(metadata=key("request.transient.ms"))  # 0: off
    gc_period_s: float = field(metadata=key("request.gc.period.ms"))  # between collector passes
    # a worker's asks to the monitor: at most this many, this long apart (read by the worker)
    worker_repeats: int = field(metadata=key("request.worker.repeats"))
    worker_wait_s: float = field(metadata=key("request.worker.wait.ms"))
    check_s: float = field(metadata=key("request.delegator.check.ms"))  # 0: work.lease.ms

    @classmethod
    def from_settings(cls, settings: Settings) -> RequestSettings:
        return read(cls, settings)

    def as_text(self) -> dict[str, str]:
        """Every setting by key, as property text (ms for the times)."""
        out = {}
        for attr, (key, _) in REQUEST_KEYS.items():
            value = getattr(self, attr)
            out[key] = str(round(value * 1000)) if attr.endswith("_s") else str(value)
        return out

    def overridden(self, changes: dict[str, str], where: str) -> RequestSettings:
        """These settings with `changes` (key → text) applied; ConfigError names a bad one."""
        table = {key.name: key for key in HCM_KEYS}
        values: dict[str, object] = {}
        for name, text in {**self.as_text(), **changes}.items():
            if name not in table or not name.startswith("request."):
                raise ConfigError(f"{where}: {name!r} is not a request setting")
            values[name] = table[name].parse(text, where)
        if values["request.retry.pattern"]:
            try:
                re.compile(str(values["request.retry.pattern"]))
            except re.error as error:
                raise ConfigError(f"{where}: request.retry.pattern: {error}") from None
        return RequestSettings.from_settings(Settings(where, values))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Thresholds:
    """Every number of the placement and relocation algorithm (`roq.monitor.placement`)."""

    # bytes/s an exchange is sized for
    max_throughput: float = field(metadata=key("exchange.max.throughput"))
    # step 2: overloaded above overload × max
    overload: float = field(default=1.10, metadata=key("relocate.overload"))
    # step 4a: a candidate must stay below target × max
    target: float = field(default=0.90, metadata=key("relocate.target"))
    # step 4b: or the move narrows a gap wider than this share
    optimise: float = field(default=0.20, metadata=key("relocate.optimise"))
    # below this share everywhere, spread publishers by count
    coldstart: float = field(default=0.10, metadata=key("relocate.coldstart"))
    # top-k producers moved per decision (RoQ moved 1)
    producers_max: int = field(default=3, metadata=key("relocate.producers.max"))
    # consecutive overloaded reports before acting
    hysteresis: int = field(default=2, metadata=key("relocate.hysteresis"))
    # no second decision for the same exchange within this
    cooldown_s: float = field(default=5.0, metadata=key("relocate.cooldown"))
    # a new exchange takes publishers after this long at the latest
    warmup_s: float = field(default=1.0, metadata=key("exchange.warmup"))

    @classmethod
    def from_settings(cls, settings: Settings) -> Thresholds:
        return read(cls, settings)


@dataclass(frozen=True)
class ScalingConfig:
    """The scaling policy's numbers (`roq.monitor.policy`) and how often its actuator re-reads
    the queue's rules."""

    policy: str = field(default="default", metadata=key("scaling.policy"))  # default or null
    window_s: float = field(default=2.0, metadata=key("scaling.window.ms"))
    cooldown_s: float = field(default=10.0, metadata=key("scaling.cooldown.ms"))
    highwater: float = field(default=0.9, metadata=key("scaling.highwater"))
    lowwater: float = field(default=0.3, metadata=key("scaling.lowwater"))
    lowwater_s: float = field(default=30.0, metadata=key("scaling.lowwater.ms"))
    min_exchanges: int = field(default=1, metadata=key("scaling.min.exchanges"))
    # 0: as many as the hosts have slots for
    max_exchanges: int = field(default=0, metadata=key("scaling.max.exchanges"))
    max_throughput: float = field(default=100_000_000.0, metadata=key("exchange.max.throughput"))
    rules_refresh_s: float = field(default=30.0, metadata=key("scaling.rules.refresh.ms"))

    @classmethod
    def from_settings(cls, settings: Settings) -> ScalingConfig:
        return read(cls, settings)


@dataclass(frozen=True)
class MonitorSettings:
    stat_period_s: float = field(metadata=key("monitor.stat.period"))  # the queue KPI
    # the exchange list republished to subscribers
    list_period_s: float = field(metadata=key("monitor.list.period"))
    dead_heartbeats: int = field(metadata=key("monitor.dead.heartbeats"))
    replication_factor: int = field(metadata=key("replicationFactor"))
    thresholds: Thresholds
    scaling: ScalingConfig
    zk: ZooKeeperSettings  # where the scaling actuator finds the GCM; the groups' state
    work: WorkSettings
    requests: RequestSettings
    # where the task records are kept (zookeeper | log: the state log, monitor/state.py)
    delivery_state: str = field(metadata=key("delivery.state"))
    log_root: str = field(metadata=key("directory"))  # the state log beside the message logs
    log: LogSettings  # the state log's flush policy is the message logs'
    min_insync_copies: int = field(metadata=key("min.insync.copies"))  # 0: replicationFactor
    # copies held by log followers rather than exchanges (monitor/scaling.py, placement.py)
    log_followers: int = field(metadata=key("log.followers"))
    host_name: str = field(metadata=key("host.name"))  # its state log's copies go elsewhere
    use_log: bool = field(metadata=key("useLog"))  # false: no exchange can copy its state log

    security: SecuritySettings
    gcm: GcmAddress  # the scaling actuator's GCM when ZooKeeper names no leader

    @classmethod
    def from_settings(cls, settings: Settings) -> MonitorSettings:
        return read(cls, settings, log=log_settings(settings))


@dataclass(frozen=True)
class ExchangeSettings:
    heartbeat_s: float = field(metadata=key("heartbeat.period"))  # the report to the monitor
    stat_period_s: float = field(metadata=key("monitor.stat.period"))  # the KPI stream
    publisher_hwm_batches: int = field(metadata=key("exchange.publisher.hwm"))
    subscriber_hwm_batches: int = field(metadata=key("exchange.subscriber.hwm"))
    host_name: str = field(metadata=key("host.name"))  # empty: the exchange's address
    use_log: bool = field(metadata=key("useLog"))
    log_root: str = field(metadata=key("directory"))
    log: LogSettings
    security: SecuritySettings
    # a slot of the log closes after this many
    slot_messages: int = field(default=1000, metadata=key("work.slot.messages"))
    replication_factor: int = field(default=1, metadata=key("replicationFactor"))
    min_insync_copies: int = field(default=0, metadata=key("min.insync.copies"))  # 0: R
    dedup_window_ms: int = field(default=0, metadata=key("dedup.window.ms"))  # 0: off
    # its host's session: how long it stays fenced before it exits (system/lease.py)
    session_timeout_ms: int = field(default=6000, metadata=key("zk.session.timeout"))

    @property
    def copies_for_acks_all(self) -> int:
        """How many copies in sync acks=all needs: min.insync.copies (0: replicationFactor),
        at most replicationFactor (more could never be in sync)."""
        wanted = self.min_insync_copies or self.replication_factor
        return max(1, min(wanted, self.replication_factor))

    @classmethod
    def from_settings(cls, settings: Settings) -> ExchangeSettings:
        return read(
            cls,
            settings,
            log=log_settings(settings),
        )


# --- the HTTP gateway (HCM.properties) -----------------------------------------------------
@dataclass(frozen=True)
class HttpSettings:
    enabled: bool = field(metadata=key("http.enabled"))
    # an address or an interface name, resolved at start
    interface: str = field(metadata=key("network.interface"))
    port: int = field(metadata=key("http.port"))
    queues: tuple[str, ...]  # the roq queues holding the messages (http.queue.prefix, .queues)
    acks: str = field(metadata=key("http.acks"))  # leader | all
    # a PEM file; empty (with tls_key) is plain HTTP
    tls_cert: str = field(metadata=key("http.tls.cert"))
    tls_key: str = field(metadata=key("http.tls.key"))
    max_queue_size: int = field(metadata=key("maxQueueSize"))  # messages kept per topic
    max_name_len: int = field(metadata=key("maxNameLen"))  # characters
    max_msg_size: int = field(metadata=key("maxMsgSize"))  # bytes of UTF-8
    max_topics: int = field(metadata=key("maxTopics"))
    max_subscribers: int = field(metadata=key("maxSubscribers"))  # per topic
    # per-principal quotas (issue 31, finding 7): topics (cluster-wide), and on each gateway
    # requests in progress and published bytes per second (0: none)
    topics_quota: int = field(metadata=key("http.topics.per.principal"))
    requests_quota: int = field(metadata=key("http.requests.per.principal"))
    bytes_quota: int = field(metadata=key("http.publish.bytes.per.principal"))
    # memory for the messages' text and meta; past it they are read back from the logs
    cache_bytes: int = field(metadata=key("http.cache.bytes"))
    # where the topics are kept: log (the state logs of the http-N queues' monitors) | zookeeper
    delivery_state: str = field(metadata=key("delivery.state"))
    log_root: str = field(metadata=key("directory"))  # the gateway's snapshots beside the logs
    zk: ZooKeeperSettings

    security: SecuritySettings

    @classmethod
    def from_settings(cls, settings: Settings) -> HttpSettings:
        prefix = settings._str("http.queue.prefix")
        count = settings._int("http.queues")
        return read(cls, settings, queues=tuple(f"{prefix}-{n}" for n in range(count)))


# --- `roq up` (both files) --------------------------------------------------------------------
@dataclass(frozen=True)
class UpSettings:
    """What `roq up` needs of the files it starts its GCM and its host with: where they serve."""

    zk_servers: str  # the GCM's zk.servers (ZooKeeper is started there when none answers)
    gcm_interface: str
    gcm_ports_base: int
    host_name: str  # the host's host.name, else its network.interface
    host_interface: str
    hcm_port: int
    security: SecuritySettings  # the GCM's: `roq up` generates the keys its daemons share
    http_enabled: bool  # http.enabled: `roq up` starts `roq http`
    http_port: int
    http_tls: bool  # http.tls.cert is set: the gateway serves HTTPS
    gcm_metrics_port: int  # the GCM's metrics.port (0: no listener)
    host_metrics_port: int  # the host's hcm.metrics.port (0: no listener)
    logging: LoggingSettings  # the host's: `roq up` logs as its children do

    @classmethod
    def from_settings(cls, gcm: Settings, hcm: Settings) -> UpSettings:
        return cls(
            security=SecuritySettings.from_settings(gcm),
            zk_servers=gcm._str("zk.servers"),
            gcm_interface=gcm._str("network.interface"),
            gcm_ports_base=gcm._int("ports.base"),
            host_name=hcm._str("host.name") or hcm._str("network.interface"),
            host_interface=hcm._str("network.interface"),
            hcm_port=hcm._int("hcm.port"),
            http_enabled=hcm._bool("http.enabled"),
            http_port=hcm._int("http.port"),
            http_tls=bool(hcm._str("http.tls.cert")),
            gcm_metrics_port=gcm._int("metrics.port"),
            host_metrics_port=hcm._int("hcm.metrics.port"),
            logging=LoggingSettings.from_settings(hcm),
        )
