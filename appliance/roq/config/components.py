"""Each component's settings: read once, at its start, into a frozen dataclass with units converted.

No code outside this package looks a key up by name. A component calls its dataclass's
`from_settings` when it starts, so a misspelled key fails that start (and
tests/unit/test_config.py, which checks that every key read here is declared in `keys.py` and
that every declared key is read here or listed in `keys.NOT_READ`), never a hot path. Units are in
the field names: durations become seconds (`_s`, float) unless the consumer takes milliseconds
(`_ms`, int).

The pure packages keep their own types and never read keys: the log's `LogSettings` is built here
by `log_settings`.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

from roq import limits
from roq.config.keys import HCM_KEYS
from roq.config.loader import Settings
from roq.errors import ConfigError
from roq.log import FlushPolicy, LogSettings, Retention

_SAFE = re.compile(r"^[A-Za-z0-9.,:_\-]*$")  # what ami/files/roq-configure accepts in role.env
# An SSM parameter name (AWS's rule; roq-configure accepts the same for ROQ_CLUSTER_PARAMETER)
_PARAMETER = re.compile(r"^[A-Za-z0-9_.\-/]+$")


# --- shared by several components ------------------------------------------------------------
@dataclass(frozen=True)
class ZooKeeperSettings:
    servers: str  # zk.servers, a connect string
    namespace: str  # zk.namespace, the cluster's root znode
    session_timeout_ms: int

    @classmethod
    def from_settings(cls, settings: Settings) -> ZooKeeperSettings:
        return cls(
            servers=settings._str("zk.servers"),
            namespace=settings._str("zk.namespace"),
            session_timeout_ms=settings._int("zk.session.timeout"),
        )


@dataclass(frozen=True)
class SecuritySettings:
    enabled: bool  # security
    directory: str  # security.dir: cluster.json and admin.json

    @classmethod
    def from_settings(cls, settings: Settings) -> SecuritySettings:
        return cls(enabled=settings._bool("security"), directory=settings._str("security.dir"))


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

    use: bool
    user: str
    endpoint: str
    gateway: str

    @classmethod
    def from_settings(cls, settings: Settings) -> CloudSettings:
        return cls(
            use=settings._bool("cloud.use"),
            user=settings._str("cloud.user"),
            endpoint=settings._str("cloud.endpoint"),
            gateway=settings._str("cloud.gateway"),
        )


@dataclass(frozen=True)
class Ec2Config:
    """The ec2 provisioner's settings (roq.gcm.provisioning), checked when they are read.

    No credential is among them: boto3 finds its own (the AWS chain), and a GCM.properties that
    still sets `cloud.password` is refused by the loader (`keys.RETIRED`)."""

    region: str
    endpoint: str  # empty: boto3's endpoint for the region; else a VPC endpoint or an emulator
    image: str
    instance_type: str
    instance_profile: str  # IAM instance profile of new instances (name or ARN); empty: none
    key_name: str
    security_groups: tuple[str, ...]
    subnet: str
    join_zk: str
    join_namespace: str
    join_gcm: str
    join_interface: str
    gcm_ports_base: int
    instances_max: int
    cooldown_s: float
    timeout_s: float
    cluster_parameter: str  # the SSM parameter holding cluster.json; the host fetches it
    secured: bool  # security: then a host needs the cluster's keys, so the parameter above

    @classmethod
    def from_settings(cls, settings: Settings) -> Ec2Config:
        config = cls(
            region=settings._str("cloud.region"),
            endpoint=settings._str("cloud.endpoint"),
            image=settings._str("cloud.image"),
            instance_type=settings._str("cloud.instance.type"),
            instance_profile=settings._str("cloud.instance.profile"),
            key_name=settings._str("cloud.key.name"),
            security_groups=tuple(
                g.strip() for g in settings._str("cloud.security.groups").split(",") if g.strip()
            ),
            subnet=settings._str("cloud.subnet"),
            join_zk=settings._str("cloud.join.zk") or settings._str("zk.servers"),
            join_namespace=settings._str("zk.namespace"),
            join_gcm=settings._str("cloud.join.gcm") or settings._str("network.interface"),
            join_interface=settings._str("cloud.join.interface"),
            gcm_ports_base=settings._int("ports.base"),
            instances_max=settings._int("cloud.instances.max"),
            cooldown_s=settings._seconds("cloud.provision.cooldown.ms"),
            timeout_s=settings._seconds("cloud.request.timeout.ms"),
            cluster_parameter=settings._str("cloud.cluster.parameter"),
            secured=settings._bool("security"),
        )
        config.check(settings.source)
        return config

    def check(self, where: str) -> None:
        """Refuse at start-up what would make a broken launch later."""
        for key, value in (("cloud.image", self.image), ("cloud.region", self.region)):
            if not value:
                raise ConfigError(f"{where}: provisioner=ec2 needs key '{key}'")
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
    interface: str  # network.interface: an address or an interface name, resolved when bound
    ports_base: int
    broadcast_period_s: float  # period
    host_timeout_ms: int  # hcmTIMEOUT, one request to a host (the Requester takes ms)
    host_loss_grace_s: float  # host.loss.grace: a host gone this long has its work re-placed
    format_db: bool
    zk: ZooKeeperSettings
    cloud: CloudSettings
    provisioning: ProvisioningSettings

    security: SecuritySettings

    @classmethod
    def from_settings(cls, settings: Settings) -> GcmSettings:
        return cls(
            security=SecuritySettings.from_settings(settings),
            interface=settings._str("network.interface"),
            ports_base=settings._int("ports.base"),
            broadcast_period_s=settings._seconds("period"),
            host_timeout_ms=settings._int("hcmTIMEOUT"),
            host_loss_grace_s=settings._seconds("host.loss.grace"),
            format_db=settings._bool("formatDB"),
            zk=ZooKeeperSettings.from_settings(settings),
            cloud=CloudSettings.from_settings(settings),
            provisioning=ProvisioningSettings.from_settings(settings),
        )


# --- the host and its children (HCM.properties) -------------------------------------------------
@dataclass(frozen=True)
class HostSettings:
    interface: str  # network.interface: an address or an interface name, resolved at start
    name: str  # host.name; empty: the announced address
    hcm_port: int
    monitor_base_port: int
    stat_base_port: int  # statmonitor.base.port
    exchange_base_port: int
    ports_per_kind_max: int  # ports.max.perkind
    exchanges_max: int  # exchange.max.perhost
    zk: ZooKeeperSettings
    use_log: bool
    log_root: str  # directory: the queues' logs and the copies of other exchanges' logs
    # Every value that differs from its default, as (key, text): a child (monitor, exchange)
    # gets them as -D options, so it runs with its host's settings without reading its file.
    child_overrides: tuple[tuple[str, str], ...]

    security: SecuritySettings

    @classmethod
    def from_settings(cls, settings: Settings) -> HostSettings:
        return cls(
            security=SecuritySettings.from_settings(settings),
            interface=settings._str("network.interface"),
            name=settings._str("host.name"),
            hcm_port=settings._int("hcm.port"),
            monitor_base_port=settings._int("monitor.base.port"),
            stat_base_port=settings._int("statmonitor.base.port"),
            exchange_base_port=settings._int("exchange.base.port"),
            ports_per_kind_max=settings._int("ports.max.perkind"),
            exchanges_max=settings._int("exchange.max.perhost"),
            zk=ZooKeeperSettings.from_settings(settings),
            use_log=settings._bool("useLog"),
            log_root=settings._str("directory"),
            child_overrides=tuple(settings.changed(HCM_KEYS).items()),
        )


@dataclass(frozen=True)
class WorkSettings:
    """Work queues: the consumer groups' slot manager in each queue's monitor."""

    slot_messages: int  # work.slot.messages (the exchange cuts its log's slots by count)
    slot_s: float  # work.slot.ms (the monitor closes a slot open this long)
    lease_s: float  # work.lease.ms
    inflight: int  # work.inflight
    backoff_s: float  # work.redelivery.backoff.ms
    max_deliveries: int  # work.max.deliveries

    @classmethod
    def from_settings(cls, settings: Settings) -> WorkSettings:
        return cls(
            slot_messages=settings._int("work.slot.messages"),
            slot_s=settings._seconds("work.slot.ms"),
            lease_s=settings._seconds("work.lease.ms"),
            inflight=settings._int("work.inflight"),
            backoff_s=settings._seconds("work.redelivery.backoff.ms"),
            max_deliveries=settings._int("work.max.deliveries"),
        )


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
}  # fmt: skip


@dataclass(frozen=True)
class RequestSettings:
    """Request queues: a queue's monitor keeps its tasks (monitor/tasks.py). The HCM's values are
    every queue's defaults; `roq task config QUEUE KEY=VALUE` overrides them per queue."""

    repeats: int  # request.delegator.repeats
    repeat_wait_s: float  # request.delegator.wait.ms
    send_probes: int  # request.send.probes
    retry_pattern: str  # request.retry.pattern
    retry_max: int  # request.retry.max
    input_ttl_s: float  # request.input.ttl.ms
    result_ttl_s: float  # request.result.ttl.ms
    delay_s: float  # request.delay.ms

    @classmethod
    def from_settings(cls, settings: Settings) -> RequestSettings:
        return cls(
            repeats=settings._int("request.delegator.repeats"),
            repeat_wait_s=settings._seconds("request.delegator.wait.ms"),
            send_probes=settings._int("request.send.probes"),
            retry_pattern=settings._str("request.retry.pattern"),
            retry_max=settings._int("request.retry.max"),
            input_ttl_s=settings._seconds("request.input.ttl.ms"),
            result_ttl_s=settings._seconds("request.result.ttl.ms"),
            delay_s=settings._seconds("request.delay.ms"),
        )

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

    max_throughput: float  # bytes/s an exchange is sized for
    overload: float = 1.10  # step 2: overloaded above overload × max
    target: float = 0.90  # step 4a: a candidate must stay below target × max
    optimise: float = 0.20  # step 4b: or the move narrows a gap wider than this share
    coldstart: float = 0.10  # below this share everywhere, spread publishers by count
    producers_max: int = 3  # top-k producers moved per decision (RoQ moved 1)
    hysteresis: int = 2  # consecutive overloaded reports before acting
    cooldown_s: float = 5.0  # no second decision for the same exchange within this
    warmup_s: float = 1.0  # a new exchange takes publishers after this long at the latest

    @classmethod
    def from_settings(cls, settings: Settings) -> Thresholds:
        return cls(
            max_throughput=settings._int("exchange.max.throughput"),
            overload=settings._float("relocate.overload"),
            target=settings._float("relocate.target"),
            optimise=settings._float("relocate.optimise"),
            coldstart=settings._float("relocate.coldstart"),
            producers_max=settings._int("relocate.producers.max"),
            hysteresis=settings._int("relocate.hysteresis"),
            cooldown_s=settings._seconds("relocate.cooldown"),
            warmup_s=settings._seconds("exchange.warmup"),
        )


@dataclass(frozen=True)
class ScalingConfig:
    """The scaling policy's numbers (`roq.monitor.policy`) and how often its actuator re-reads
    the queue's rules."""

    policy: str = "default"  # scaling.policy: default or null
    window_s: float = 2.0
    cooldown_s: float = 10.0
    highwater: float = 0.9
    lowwater: float = 0.3
    lowwater_s: float = 30.0
    min_exchanges: int = 1
    max_exchanges: int = 0  # 0: as many as the hosts have slots for
    max_throughput: float = 100_000_000.0
    rules_refresh_s: float = 30.0

    @classmethod
    def from_settings(cls, settings: Settings) -> ScalingConfig:
        return cls(
            policy=settings._str("scaling.policy"),
            window_s=settings._seconds("scaling.window.ms"),
            cooldown_s=settings._seconds("scaling.cooldown.ms"),
            highwater=settings._float("scaling.highwater"),
            lowwater=settings._float("scaling.lowwater"),
            lowwater_s=settings._seconds("scaling.lowwater.ms"),
            min_exchanges=settings._int("scaling.min.exchanges"),
            max_exchanges=settings._int("scaling.max.exchanges"),
            max_throughput=float(settings._int("exchange.max.throughput")),
            rules_refresh_s=settings._seconds("scaling.rules.refresh.ms"),
        )


@dataclass(frozen=True)
class MonitorSettings:
    stat_period_s: float  # monitor.stat.period: the queue KPI
    list_period_s: float  # monitor.list.period: the exchange list republished to subscribers
    dead_heartbeats: int  # monitor.dead.heartbeats
    replication_factor: int
    thresholds: Thresholds
    scaling: ScalingConfig
    zk: ZooKeeperSettings  # where the scaling actuator finds the GCM; the groups' state
    work: WorkSettings
    requests: RequestSettings

    security: SecuritySettings

    @classmethod
    def from_settings(cls, settings: Settings) -> MonitorSettings:
        return cls(
            security=SecuritySettings.from_settings(settings),
            stat_period_s=settings._seconds("monitor.stat.period"),
            list_period_s=settings._seconds("monitor.list.period"),
            dead_heartbeats=settings._int("monitor.dead.heartbeats"),
            replication_factor=settings._int("replicationFactor"),
            thresholds=Thresholds.from_settings(settings),
            scaling=ScalingConfig.from_settings(settings),
            zk=ZooKeeperSettings.from_settings(settings),
            work=WorkSettings.from_settings(settings),
            requests=RequestSettings.from_settings(settings),
        )


@dataclass(frozen=True)
class ExchangeSettings:
    heartbeat_s: float  # heartbeat.period: the report to the monitor
    stat_period_s: float  # monitor.stat.period: the KPI stream
    publisher_hwm_batches: int  # exchange.publisher.hwm
    subscriber_hwm_batches: int  # exchange.subscriber.hwm
    host_name: str  # host.name; empty: the exchange's address
    use_log: bool
    log_root: str  # directory
    log: LogSettings
    security: SecuritySettings
    slot_messages: int = 1000  # work.slot.messages: a slot of the log closes after this many

    @classmethod
    def from_settings(cls, settings: Settings) -> ExchangeSettings:
        return cls(
            security=SecuritySettings.from_settings(settings),
            heartbeat_s=settings._seconds("heartbeat.period"),
            stat_period_s=settings._seconds("monitor.stat.period"),
            publisher_hwm_batches=settings._int("exchange.publisher.hwm"),
            subscriber_hwm_batches=settings._int("exchange.subscriber.hwm"),
            host_name=settings._str("host.name"),
            use_log=settings._bool("useLog"),
            log_root=settings._str("directory"),
            log=log_settings(settings),
            slot_messages=settings._int("work.slot.messages"),
        )


# --- the HTTP gateway (HCM.properties) -----------------------------------------------------
@dataclass(frozen=True)
class HttpSettings:
    enabled: bool  # http.enabled
    interface: str  # network.interface: an address or an interface name, resolved at start
    port: int  # http.port
    queues: tuple[str, ...]  # the roq queues holding the messages (http.queue.prefix, .queues)
    acks: str  # http.acks: leader | all
    tls_cert: str  # http.tls.cert: a PEM file; empty (with tls_key) is plain HTTP
    tls_key: str  # http.tls.key
    max_queue_size: int  # maxQueueSize: messages kept per topic
    max_name_len: int  # maxNameLen: characters
    max_msg_size: int  # maxMsgSize: bytes of UTF-8
    max_topics: int
    max_subscribers: int  # per topic
    zk: ZooKeeperSettings

    security: SecuritySettings

    @classmethod
    def from_settings(cls, settings: Settings) -> HttpSettings:
        prefix = settings._str("http.queue.prefix")
        return cls(
            security=SecuritySettings.from_settings(settings),
            enabled=settings._bool("http.enabled"),
            interface=settings._str("network.interface"),
            port=settings._int("http.port"),
            queues=tuple(f"{prefix}-{n}" for n in range(settings._int("http.queues"))),
            acks=settings._str("http.acks"),
            tls_cert=settings._str("http.tls.cert"),
            tls_key=settings._str("http.tls.key"),
            max_queue_size=settings._int("maxQueueSize"),
            max_name_len=settings._int("maxNameLen"),
            max_msg_size=settings._int("maxMsgSize"),
            max_topics=settings._int("maxTopics"),
            max_subscribers=settings._int("maxSubscribers"),
            zk=ZooKeeperSettings.from_settings(settings),
        )


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
        )
