"""Certificates and keys for a throw-away control plane, made with ``cryptography``."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=7)


@dataclass(frozen=True)
class Pki:
    """Paths of every PEM file the control plane and its clients use."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    service_account_key: Path
    service_account_public_key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def _issue(
    subject: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    is_ca: bool = False,
    usages: list[x509.ObjectIdentifier] | None = None,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if is_ca:
        builder = builder.add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def create_pki(directory: Path, extra_addresses: tuple[str, ...] = ()) -> Pki:
    """Create a CA, a serving certificate for 127.0.0.1 (and ``extra_addresses``), an admin client and SA keys."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        service_account_key=directory / "sa.key",
        service_account_public_key=directory / "sa.pub",
    )
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("kube-rendezvous-testenv-ca")
    ca = _issue(ca_name, ca_key.public_key(), ca_name, ca_key, is_ca=True)
    _write_key(pki.ca_key, ca_key)
    pki.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))

    serving_key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
        *(x509.IPAddress(ipaddress.ip_address(address)) for address in extra_addresses),
    ]
    serving = _issue(
        _name("kube-apiserver"),
        serving_key.public_key(),
        ca_name,
        ca_key,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH],
        sans=sans,
    )
    _write_key(pki.serving_key, serving_key)
    pki.serving_cert.write_bytes(serving.public_bytes(serialization.Encoding.PEM))

    admin_key = ec.generate_private_key(ec.SECP256R1())
    admin = _issue(
        _name("kube-rendezvous-admin", "system:masters"),
        admin_key.public_key(),
        ca_name,
        ca_key,
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
    )
    _write_key(pki.admin_key, admin_key)
    pki.admin_cert.write_bytes(admin.public_bytes(serialization.Encoding.PEM))

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.service_account_key, sa_key)
    pki.service_account_public_key.write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return pki


def create_client_certificate(pki: Pki, directory: Path, common_name: str, organization: str) -> tuple[Path, Path]:
    """Issue a client certificate signed by ``pki``'s CA (a kubelet's: ``system:node:<name>``, ``system:nodes``)."""
    ca = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = _issue(
        _name(common_name, organization),
        key.public_key(),
        ca.subject,
        ca_key,
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = (
        directory / f"{common_name.replace(':', '-')}.crt",
        directory / f"{common_name.replace(':', '-')}.key",
    )
    _write_key(key_path, key)
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path
