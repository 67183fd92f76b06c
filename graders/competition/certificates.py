"""The fleet's certificates: who may join an organiser's Dask cluster across machines.

Without them, anything that reaches the scheduler's port can join as a worker, read the seed and every
team's solution in the jobs it is given, and return forged points. With them (Dask's TLS: `tls://`
addresses, `distributed.Security`), the scheduler, every worker and the organiser's score.py each present
the fleet's certificate, signed by the organiser's own authority, and refuse a peer that does not: a
worker without it never joins.

    uv run graders/score.py --make-certificates fleet-tls/     # the organiser, once: ca.pem and fleet.pem

`fleet.pem` holds the fleet's certificate and its private key: copy the folder to each grading machine
(and keep it from anyone else); `ca.pem` is the authority's certificate alone. The authority's own key is
not kept: a new fleet makes new certificates.

May import: the standard library, cryptography, distributed (where a cluster is reached).
"""
from __future__ import annotations

import datetime
import os
from pathlib import Path

CA, FLEET = "ca.pem", "fleet.pem"
VALID_DAYS = 365


def make(directory: Path) -> tuple[Path, Path]:
    """Write an authority's certificate (ca.pem) and the fleet's certificate and key signed by it
    (fleet.pem, readable by its owner alone) into `directory`; return both paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def certificate(subject: str, key, issuer: str, signer, ca: bool) -> x509.Certificate:
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                                   ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        return builder.sign(signer, hashes.SHA256())

    authority_key, fleet_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    authority = certificate("fx-katas fleet authority", authority_key, "fx-katas fleet authority", authority_key, True)
    fleet = certificate("fx-katas fleet", fleet_key, "fx-katas fleet authority", authority_key, False)
    ca_path, fleet_path = directory / CA, directory / FLEET
    ca_path.write_bytes(authority.public_bytes(serialization.Encoding.PEM))
    key = fleet_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption())
    descriptor = os.open(fleet_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)  # a fleet.pem already there keeps its mode through O_CREAT: made private first
    with os.fdopen(descriptor, "wb") as out:
        out.write(fleet.public_bytes(serialization.Encoding.PEM) + key)
    return ca_path, fleet_path


def security(directory: Path):
    """What score.py presents to a `tls://` scheduler: the fleet's certificate, checked against ca.pem both ways."""
    from distributed import Security

    missing = [name for name in (CA, FLEET) if not (directory / name).is_file()]
    if missing:
        raise FileNotFoundError(f"--certificates {directory}: no {' or '.join(missing)} there "
                                "(`uv run graders/score.py --make-certificates DIR` makes them)")
    fleet = str(directory / FLEET)
    return Security(tls_ca_file=str(directory / CA), tls_client_cert=fleet, tls_client_key=fleet,
                    require_encryption=True)


def plain_warning(address: str) -> str | None:
    """The sentence for a cluster reached without TLS, or None."""
    if address.startswith("tls://"):
        return None
    return (f"Warning: --cluster {address} is not encrypted and admits any worker: whoever reaches that port can "
            "join, read the seed and the teams' files, and return forged points. Across machines, use a tls:// "
            "scheduler with --certificates (docs/organisers.md, \"Many machines\").")
