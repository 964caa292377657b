"""TLS of the secure port: a server ``ssl.SSLContext`` from certificate files, or from a
self-signed certificate made at startup when none is given (kube components do the same:
``--tls-cert-file``/``--tls-private-key-file`` unset -> a self-signed pair for the host).

Role: the composition root (``scheduler.commands.run``) builds the context; ``HealthServer``
wraps its accepted sockets with it. Invariants: TLS 1.2 at least; a generated private key never
touches a disk longer than ``load_cert_chain`` needs it (a private temp dir, removed at once),
so it lives only in the context; every failure is a ``TLSError`` of one line.

Also here: ``issue_serving`` makes a private CA and a serving certificate it signs (the
admission webhook's one-shot ``certs`` command: the API server trusts the CA, the webhook
serves the leaf), and ``CertReloader`` swaps the files of a rotated Secret into a running
context (new handshakes use them; a broken pair keeps the old one).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
from collections.abc import Sequence
from typing import Any

__all__ = [
    "CertReloader",
    "TLSError",
    "issue_serving",
    "load_server_context",
    "self_signed",
    "server_context",
]

SELF_SIGNED_DAYS = 365


class TLSError(Exception):
    """A certificate or key that cannot be served (one line)."""


def _context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def load_server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """The context serving ``cert_file`` (PEM, chain allowed) with ``key_file``."""
    ctx = _context()
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        detail = " ".join(str(exc).split())
        raise TLSError(f"--tls-cert-file {cert_file}, --tls-private-key-file {key_file}: "
                       f"{detail}") from None  # fmt: skip
    return ctx


def server_context(cert_pem: bytes, key_pem: bytes) -> ssl.SSLContext:
    """The context serving an in-memory PEM pair (``self_signed``'s)."""
    with tempfile.TemporaryDirectory(prefix="koord-tls-") as tmp:  # mode 0700
        cert, key = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(key_pem)
        with open(cert, "wb") as out:
            out.write(cert_pem)
        ctx = _context()
        try:
            ctx.load_cert_chain(cert, key)
        except ssl.SSLError as exc:
            raise TLSError(f"generated certificate: {exc}") from None
    return ctx


def self_signed(hosts: Sequence[str], *, days: int = SELF_SIGNED_DAYS) -> tuple[bytes, bytes]:
    """(certificate, key) in PEM: ECDSA P-256, self-signed for ``hosts`` (DNS names and IP
    addresses as subjectAltNames; the first is the common name, suffixed ``@<unix time>`` as
    kube's self-signed serving certificates are)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not hosts:
        raise TLSError("a self-signed certificate needs at least one host")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    subject = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, f"{hosts[0]}@{int(now.timestamp())}")]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _pem(cert, key)


def _pem(cert: Any, key: Any) -> tuple[bytes, bytes]:
    from cryptography.hazmat.primitives import serialization

    return (
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def issue_serving(
    hosts: Sequence[str], *, common_name: str = "koord-webhook-ca", days: int = SELF_SIGNED_DAYS
) -> tuple[bytes, bytes, bytes]:
    """(CA certificate, serving certificate, serving key) in PEM: a new ECDSA P-256 CA valid
    ``days``, and a leaf for ``hosts`` (DNS names and IPs as subjectAltNames; Go clients
    ignore the common name) signed by it. The CA's key is dropped: nothing else is issued."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not hosts:
        raise TLSError("a serving certificate needs at least one host")
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(x509, signer=True), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(x509, signer=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_pem, key_pem = _pem(leaf, key)
    return _pem(ca, ca_key)[0], cert_pem, key_pem


def _key_usage(x509: Any, *, signer: bool) -> Any:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signer,
        crl_sign=signer,
        encipher_only=False,
        decipher_only=False,
    )


class CertReloader:
    """Loads ``cert_file``/``key_file`` again into ``context`` when either changes on disk
    (a mounted Secret is rotated by replacing its files). ``check()`` returns None, or the
    one-line reason a changed pair was not loaded (the context keeps serving the old one)."""

    def __init__(self, context: ssl.SSLContext, cert_file: str, key_file: str) -> None:
        self.context = context
        self._files = (cert_file, key_file)
        self._seen = self._stamp()

    def _stamp(self) -> tuple[tuple[float, int], ...]:
        out = []
        for path in self._files:
            try:
                st = os.stat(path)
            except OSError:
                out.append((0.0, -1))
            else:
                out.append((st.st_mtime, st.st_size))
        return tuple(out)

    def check(self) -> str | None:
        stamp = self._stamp()
        if stamp == self._seen:
            return None
        try:
            # A trial load first: a failed load_cert_chain may leave a context with the new
            # certificate and the old key, which no handshake would survive.
            _context().load_cert_chain(*self._files)
            self.context.load_cert_chain(*self._files)
        except (OSError, ssl.SSLError) as exc:
            return " ".join(str(exc).split()) or type(exc).__name__
        self._seen = stamp
        return None
