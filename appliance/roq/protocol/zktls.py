"""The TLS material of a cluster's ZooKeeper connections (docs/security.md §4): pure data.

cluster.json and admin.json carry it as `"zk_tls": {"ca", "cert", "key"}`, each a PEM text:
the certificate of the cluster's own CA (the one issuer a process trusts: ZooKeeper's server
certificate must chain to it, whatever public CA the system trusts), and the certificate and
private key the holder presents. transport/certificates.py makes them at a cluster's first
start; coordination/session.py and local/zkserver.py use them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from roq import limits

_MARKERS = {
    "ca": "-----BEGIN CERTIFICATE-----",
    "cert": "-----BEGIN CERTIFICATE-----",
    "key": "-----BEGIN PRIVATE KEY-----",
}


@dataclass(frozen=True, repr=False)
class ZkTls:
    """PEM texts: the cluster CA's certificate, the holder's certificate and private key."""

    ca: str
    cert: str
    key: str

    def __repr__(self) -> str:  # never the private key in a log line or a traceback
        return "ZkTls(ca=…, cert=…, key=<hidden>)"

    def encode(self) -> dict[str, str]:
        return {"ca": self.ca, "cert": self.cert, "key": self.key}


def decode(doc: Any, where: str) -> ZkTls | None:
    """cluster.json's or admin.json's `zk_tls` (None when absent: a file written before
    ZooKeeper TLS); ValueError naming `where` and the field when it is not what roq writes."""
    if doc is None:
        return None
    if not isinstance(doc, Mapping):
        raise ValueError(f"{where}: 'zk_tls' is not an object of PEM texts")
    fields = {}
    for name, marker in _MARKERS.items():
        value = doc.get(name)
        if not isinstance(value, str) or not value.startswith(marker):
            raise ValueError(f"{where}: 'zk_tls.{name}' is not a PEM text starting {marker}")
        if len(value) > limits.zk_tls_pem_chars_max:
            raise ValueError(f"{where}: 'zk_tls.{name}' is longer than any roq writes")
        fields[name] = value
    return ZkTls(**fields)
