"""Throwaway certificates for tests and benchmarks: a CA, a loopback server, clients.

Made at run time with ``cryptography`` (a dev dependency, imported only here), so no key
material is ever committed and every run has fresh keys. ECDSA P-256: fast to generate, and
what the TLS stacks on both ends negotiate by default.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Pki", "make_pki"]


@dataclass(frozen=True)
class Pki:
    """PEM files of one test PKI.

    Attributes:
        ca: the CA that signed the server and client certificates.
        server_cert: for ``localhost`` and ``127.0.0.1`` (what loopback tests dial).
        client_cert: a client certificate from ``ca`` (mutual TLS).
        stranger_ca: another CA; ``stranger_cert`` is a client certificate from it.
    """

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_ca: Path
    stranger_cert: Path
    stranger_key: Path


_Key = ec.EllipticCurvePrivateKey


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(
        now + datetime.timedelta(days=1)
    )


def _ca(cn: str) -> tuple[_Key, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    return key, _validity(builder).sign(key, hashes.SHA256())


def _leaf(
    ca_key: _Key, ca: x509.Certificate, cn: str, *, server: bool
) -> tuple[_Key, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if server:
        names: list[x509.GeneralName] = [
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return key, _validity(builder).sign(ca_key, hashes.SHA256())


def _key_pem(key: _Key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def make_pki(directory: Path) -> Pki:
    """Write a fresh CA, server and client certificates (and a stranger's) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)

    def write(name: str, data: bytes) -> Path:
        path = directory / name
        path.write_bytes(data)
        return path

    def cert_pem(cert: x509.Certificate) -> bytes:
        return cert.public_bytes(serialization.Encoding.PEM)

    ca_key, ca = _ca("voxgate test CA")
    s_key, s_cert = _leaf(ca_key, ca, "localhost", server=True)
    c_key, c_cert = _leaf(ca_key, ca, "test client", server=False)
    x_ca_key, x_ca = _ca("a stranger's CA")
    x_key, x_cert = _leaf(x_ca_key, x_ca, "stranger", server=False)
    return Pki(
        ca=write("ca.pem", cert_pem(ca)),
        server_cert=write("server.pem", cert_pem(s_cert)),
        server_key=write("server.key", _key_pem(s_key)),
        client_cert=write("client.pem", cert_pem(c_cert)),
        client_key=write("client.key", _key_pem(c_key)),
        stranger_ca=write("stranger-ca.pem", cert_pem(x_ca)),
        stranger_cert=write("stranger.pem", cert_pem(x_cert)),
        stranger_key=write("stranger.key", _key_pem(x_key)),
    )
