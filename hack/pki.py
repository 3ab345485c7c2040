"""Throw-away PKI for the local control plane, made with ``cryptography``.

One CA signs the API server's serving certificate, the node agent's serving
certificate and the API server's client certificate for talking to "kubelets"
(the node agent). A separate key pair signs service-account tokens.
Everything is written as PEM files into one directory; nothing here is secret
beyond the life of a test run.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict, Unpack

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=7)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files one :func:`make_pki` call wrote."""

    ca_cert: Path
    ca_key: Path
    apiserver_cert: Path
    apiserver_key: Path
    kubelet_client_cert: Path
    kubelet_client_key: Path
    node_cert: Path
    node_key: Path
    sa_key: Path
    sa_pub: Path

    def loopback_server_context(self) -> ssl.SSLContext:
        """A TLS server context with the API server's certificate (valid for 127.0.0.1).

        For a test's own HTTPS server on loopback; clients trust :attr:`ca_cert`.
        """
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.apiserver_cert, self.apiserver_key)
        return context


class LeafOptions(TypedDict, total=False):
    """What a leaf certificate may add to its common name; one list for every issuer."""

    org: str | None  # the subject's organization (Kubernetes reads it as a group)
    server: bool  # a serving certificate (with ``dns``/``ips`` SANs), else a client one
    dns: tuple[str, ...]
    ips: tuple[str, ...]


def _leaf(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    directory: Path,
    stem: str,
    common_name: str,
    **options: Unpack[LeafOptions],
) -> tuple[Path, Path]:
    server = options.get("server", False)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)  # tolerate small clock skew
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, options.get("org")))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if server:
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in options.get("dns", ())]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in options.get("ips", ())]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key_path, key)
    return cert_path, key_path


def issue(
    pki: Pki, stem: str, common_name: str, **options: Unpack[LeafOptions]
) -> tuple[Path, Path]:
    """One more certificate from ``pki``'s CA (e.g. a real kubelet's), beside its files."""
    ca_cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{pki.ca_key} is not the EC key make_pki writes")
    return _leaf(ca_cert, ca_key, pki.ca_cert.parent, stem, common_name, **options)


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)  # tolerate small clock skew

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("kserve-controller-test-ca")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    ca_cert_path, ca_key_path = directory / "ca.crt", directory / "ca.key"
    ca_cert_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(ca_key_path, ca_key)

    def leaf(stem: str, common_name: str, **options: Unpack[LeafOptions]) -> tuple[Path, Path]:
        return _leaf(ca_cert, ca_key, directory, stem, common_name, **options)

    api_cert, api_key = leaf(
        "apiserver",
        "kube-apiserver",
        server=True,
        dns=(
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
        ips=("127.0.0.1", "10.0.0.1"),
    )
    kc_cert, kc_key = leaf("kubelet-client", "kube-apiserver-kubelet-client", org="system:masters")
    node_cert, node_key = leaf(
        "node", "local-node", server=True, dns=("localhost",), ips=("127.0.0.1",)
    )

    # Service-account tokens are signed with RSA: every Kubernetes client verifies RS256.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa_key_path, sa_pub_path = directory / "sa.key", directory / "sa.pub"
    _write_key(sa_key_path, sa_key)
    sa_pub_path.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return Pki(
        ca_cert=ca_cert_path,
        ca_key=ca_key_path,
        apiserver_cert=api_cert,
        apiserver_key=api_key,
        kubelet_client_cert=kc_cert,
        kubelet_client_key=kc_key,
        node_cert=node_cert,
        node_key=node_key,
        sa_key=sa_key_path,
        sa_pub=sa_pub_path,
    )
