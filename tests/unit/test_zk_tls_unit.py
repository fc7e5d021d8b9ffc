"""ZooKeeper's TLS material (issue 31, finding 1; docs/security.md §4): made at the first start,
carried in cluster.json and admin.json, checked when read, and turned into the one listener of
zoo.cfg. The traffic itself is captured in tests/integration/test_zk_tls.py."""

from __future__ import annotations

import json
import ssl
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from roq import limits
from roq.coordination.session import tls_context
from roq.errors import SecurityError
from roq.local.zkserver import listener_config, write_tls_files
from roq.protocol import zktls
from roq.system.spawn import child_environment, roq_command
from roq.transport import security


def _usages(pem: str) -> set[x509.ObjectIdentifier]:
    certificate = x509.load_pem_x509_certificate(pem.encode())
    return set(certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_the_first_start_makes_a_cluster_ca_a_node_and_an_admin_certificate(tmp_path: Path):
    secrets = security.generate(tmp_path)
    node = secrets.zk_tls
    admin = security.load_credentials(tmp_path / security.ADMIN_FILE).zk_tls
    assert node is not None and admin is not None
    assert node.ca == admin.ca and node.cert != admin.cert
    ca = x509.load_pem_x509_certificate(node.ca.encode())
    for pem in (node.cert, admin.cert):
        x509.load_pem_x509_certificate(pem.encode()).verify_directly_issued_by(ca)
    assert _usages(node.cert) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert _usages(admin.cert) == {ExtendedKeyUsageOID.CLIENT_AUTH}  # cannot pose as ZooKeeper
    # the CA's key is written nowhere; the compact cluster.json still fits an SSM parameter
    cluster_text = (tmp_path / security.CLUSTER_FILE).read_text()
    assert cluster_text.count("PRIVATE KEY-----\\n") == 2  # BEGIN and END of the node's key only
    compact = json.dumps(json.loads(cluster_text), separators=(",", ":"))
    assert len(compact) < limits.ssm_value_bytes_max
    # each builds a client context (a key that does not match its certificate would not)
    tls_context(node), tls_context(admin)
    assert "PRIVATE" not in repr(node) and node.key not in repr(secrets)


def test_tls_material_that_is_not_roqs_is_refused_naming_the_field(tmp_path: Path):
    security.generate(tmp_path)
    path = tmp_path / security.CLUSTER_FILE
    doc = json.loads(path.read_text())
    for bad, field in (("not an object", "'zk_tls'"), ({"ca": "x"}, r"zk_tls\.ca")):
        doc["zk_tls"] = bad
        with pytest.raises(SecurityError, match=field):
            security.parse_cluster(doc, path)
    doc["zk_tls"] = {**json.loads(path.read_text())["zk_tls"], "key": "-----BEGIN CERTIFICATE"}
    with pytest.raises(SecurityError, match=r"zk_tls\.key"):
        security.parse_cluster(doc, path)
    del doc["zk_tls"]  # written before ZooKeeper TLS: plain TCP, as before
    assert security.parse_cluster(doc, path).zk_tls is None
    with pytest.raises(ValueError, match="longer than any roq writes"):
        zktls.decode({"ca": "-----BEGIN CERTIFICATE-----" + "A" * 9000}, "here")


def test_a_mismatched_key_is_a_security_error_not_a_crash(tmp_path: Path):
    one, other = security.generate(tmp_path / "a").zk_tls, security.generate(tmp_path / "b").zk_tls
    assert one is not None and other is not None
    with pytest.raises(SecurityError, match="ZooKeeper TLS certificate or key"):
        tls_context(zktls.ZkTls(one.ca, one.cert, other.key))


def test_zk_tls_off_in_the_environment_or_the_configuration_means_plain_tcp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    secrets = security.generate(tmp_path)
    monkeypatch.delenv(security.ZK_TLS_ENV, raising=False)
    try:
        security.use(secrets.identity())
        assert security.zk_tls() == secrets.zk_tls
        monkeypatch.setenv(security.ZK_TLS_ENV, "off")
        assert security.zk_tls() is None
        monkeypatch.delenv(security.ZK_TLS_ENV)
        security.use(security.without_zk_tls(secrets.identity(), "zk.tls=false"))
        assert security.zk_tls() is None and security.zk_auth() == secrets.zk_auth
    finally:
        security.reset()


def test_the_listener_is_tls_only_or_plain_never_both(tmp_path: Path):
    tls = security.generate(tmp_path / "s").zk_tls
    assert tls is not None
    directory = write_tls_files(tmp_path / "zk-tls", tls)
    assert (directory / "keystore.pem").read_text() == tls.key + tls.cert
    assert (directory / "truststore.pem").read_text() == tls.ca
    assert {p.stat().st_mode & 0o777 for p in directory.iterdir()} == {0o600}
    assert directory.stat().st_mode & 0o777 == 0o700
    lines = listener_config(2181, "10.0.1.10", directory).splitlines()
    assert "secureClientPort=2181" in lines and "secureClientPortAddress=10.0.1.10" in lines
    assert "ssl.clientAuth=need" in lines and not any(x.startswith("clientPort") for x in lines)
    plain = listener_config(2181, "127.0.0.1", None)
    assert plain == "clientPort=2181\nclientPortAddress=127.0.0.1\n"


def test_roq_keys_zookeeper_tls_refuses_a_cluster_json_without_certificates(tmp_path: Path):
    security.generate(tmp_path)
    path = tmp_path / security.CLUSTER_FILE
    doc = json.loads(path.read_text())
    del doc["zk_tls"]
    path.write_text(json.dumps(doc))
    result = subprocess.run(
        roq_command("keys", "zookeeper-tls", "--security-dir", str(tmp_path), "--address", "a"),
        env=child_environment(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 78, result.stderr
    assert "holds no ZooKeeper certificates" in result.stderr and result.stdout == ""


def test_the_client_context_trusts_the_cluster_ca_alone(tmp_path: Path):
    tls = security.generate(tmp_path).zk_tls
    assert tls is not None
    context = tls_context(tls)
    assert context.verify_mode == ssl.CERT_REQUIRED and not context.check_hostname
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert [c["subject"] for c in context.get_ca_certs()] == [
        ((("commonName", "roq cluster CA"),),)
    ]
