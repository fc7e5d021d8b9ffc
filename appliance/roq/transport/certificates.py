"""The certificates of a cluster's ZooKeeper TLS (docs/security.md §4), made at its first start
beside the CURVE keys, with the `cryptography` library (no ASN.1 of our own).

A cluster CA signs two certificates and is then forgotten (its private key is never written):
- the node's, presented by ZooKeeper as its server certificate and by every GCM, host, monitor
  and gateway as its client certificate (cluster.json: one per cluster, as the CURVE key is);
- the admin's, a client certificate only (admin.json: `roq keys` and the client's discovery
  open ZooKeeper sessions too), so the admin's file cannot pose as ZooKeeper.
Nothing names a host: the trust is "signed by this cluster's CA", as a CURVE server is trusted
for holding the cluster key; ZooKeeper's and kazoo's host-name checks are off (the addresses of
machines the ec2 provisioner launches are not known when the keys are made).

Decision: P-256 ECDSA (small enough that cluster.json stays within an SSM Standard parameter,
understood by ZooKeeper's PEM reader and Java's TLS), TLS 1.2 (the Debian ZooKeeper's Netty
4.1.48 failed every TLS 1.3 handshake with Java 17).
"""

from __future__ import annotations

import datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from roq import limits
from roq.protocol.zktls import ZkTls

CA_NAME = "roq cluster CA"
NODE_NAME = "roq cluster"
ADMIN_NAME = "roq admin"


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: str, issuer: str, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # clocks a little behind
        .not_valid_after(now + datetime.timedelta(days=limits.zk_tls_validity_days))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not signs_certificates, content_commitment=False,
        key_encipherment=False, data_encipherment=False, key_agreement=False,
        key_cert_sign=signs_certificates, crl_sign=signs_certificates,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip


def _pem(certificate: x509.Certificate) -> str:
    return certificate.public_bytes(serialization.Encoding.PEM).decode("ascii")


def _leaf(ca_key: ec.EllipticCurvePrivateKey, ca_pem: str, subject: str, server: bool) -> ZkTls:
    key = ec.generate_private_key(ec.SECP256R1())
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + (
        [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
    )
    certificate = (
        _builder(subject, CA_NAME, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    secret = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return ZkTls(ca_pem, _pem(certificate), secret.decode("ascii"))


def new_cluster_tls() -> tuple[ZkTls, ZkTls]:
    """A new cluster CA's (node, admin) material; the CA's key ends with this call."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        _builder(CA_NAME, CA_NAME, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = _pem(ca)
    return _leaf(ca_key, ca_pem, NODE_NAME, server=True), _leaf(ca_key, ca_pem, ADMIN_NAME, False)
