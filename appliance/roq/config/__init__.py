"""Configuration: GCM.properties and HCM.properties, checked once at start-up, read once by type.

- `keys.py`: the key tables, every key with its type, default, bounds and meaning (the shipped
  files in `config/` are rendered from them);
- `loader.py`: reading a file and `-D` overrides against a table into `Settings` (an invalid
  value, an unknown key or an unreadable file raises `ConfigError`: exit code 78);
- `components.py`: each component's frozen, typed settings (`GcmSettings`, `HostSettings`,
  `MonitorSettings`, `ExchangeSettings`, ...), built from `Settings` once at its start. No code
  outside this package looks a key up by name.
"""

from __future__ import annotations

from roq.config.components import (
    CloudSettings,
    Ec2Config,
    ExchangeSettings,
    GcmAddress,
    GcmSettings,
    HostSettings,
    HttpSettings,
    LoggingSettings,
    MonitorSettings,
    ProvisioningSettings,
    ScalingConfig,
    SecuritySettings,
    Thresholds,
    UpSettings,
    WorkSettings,
    ZooKeeperSettings,
    api_endpoint,
    check_parameter_name,
    log_settings,
)
from roq.config.keys import GCM_KEYS, HCM_KEYS, NOT_READ, Key, Value, render, render_value
from roq.config.loader import (
    Settings,
    home_file,
    load,
    load_gcm,
    load_hcm,
    parse_overrides,
    parse_properties,
)
from roq.errors import ConfigError

__all__ = [
    "GCM_KEYS",
    "HCM_KEYS",
    "NOT_READ",
    "CloudSettings",
    "ConfigError",
    "Ec2Config",
    "ExchangeSettings",
    "GcmAddress",
    "GcmSettings",
    "HostSettings",
    "HttpSettings",
    "Key",
    "LoggingSettings",
    "MonitorSettings",
    "ProvisioningSettings",
    "ScalingConfig",
    "SecuritySettings",
    "Settings",
    "Thresholds",
    "UpSettings",
    "Value",
    "WorkSettings",
    "ZooKeeperSettings",
    "api_endpoint",
    "check_parameter_name",
    "home_file",
    "load",
    "load_gcm",
    "load_hcm",
    "log_settings",
    "parse_overrides",
    "parse_properties",
    "render",
    "render_value",
]
