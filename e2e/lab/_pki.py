"""Keys and certificates for one local control plane: a CA, the API server's serving certificate, an
admin client certificate (group system:masters), the API server's client certificate for kubelets, the
service-account signing key pair, and the aggregation layer's front-proxy CA and client certificate (the
API server's identity when it proxies to an extension API server such as KEDA's metrics adapter).
`issue_leaf` signs more leaves with the cluster CA (a real node's kubelet and kube-proxy,
e2e/lab/realnode.py). `write_kubeconfig` writes a kubeconfig with one of these client certificates. Also
`write_tls_dir`, a CA and one leaf for an add-on's own TLS."""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path
    front_proxy_ca_cert: Path
    front_proxy_client_cert: Path
    front_proxy_client_key: Path
    kubelet_client_cert: Path  # kube-apiserver --kubelet-client-certificate: its identity towards kubelets
    kubelet_client_key: Path


CA_NAME = "pagoda-local-ca"
# The API server's user name towards kubelets (as kubeadm names it); in system:masters, so a kubelet's
# webhook authorization lets it read logs, exec and port-forward.
KUBELET_CLIENT = "kube-apiserver-kubelet-client"
# The front-proxy client certificate's CN: kube-apiserver --requestheader-allowed-names. Extension API
# servers trust request headers (X-Remote-User, ...) only from a client certificate with this name.
FRONT_PROXY_CLIENT = "front-proxy-client"


@dataclass(frozen=True)
class TlsDir:
    """ca.crt, tls.crt and tls.key in one directory (the layout KEDA's --cert-dir expects)."""

    directory: Path
    ca_cert: Path
    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def _name(common_name: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _issue(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    usages: tuple[x509.ObjectIdentifier, ...] = (),
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
    else:
        builder = builder.add_extension(
            x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True
        )
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def write_pki(directory: Path, extra_ips: tuple[str, ...] = ()) -> Pki:
    """Writes a fresh set of keys and certificates into `directory`. `extra_ips`: more addresses the API
    server serves on (a real node's bridge address, where its pods reach it)."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
        front_proxy_ca_cert=directory / "front-proxy-ca.crt",
        front_proxy_client_cert=directory / "front-proxy-client.crt",
        front_proxy_client_key=directory / "front-proxy-client.key",
        kubelet_client_cert=directory / "apiserver-kubelet-client.crt",
        kubelet_client_key=directory / "apiserver-kubelet-client.key",
    )
    ca_key, ca_name = _key(), _name(CA_NAME)
    ca = _issue(ca_name, ca_key, ca_name, ca_key, ca=True)
    pki.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.ca_key, ca_key)

    serving_key = _key()
    sans: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("10.96.0.1")),
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.DNSName("kubernetes.default.svc.cluster.local"),
        *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in extra_ips),
    ]
    serving = _issue(
        _name("kube-apiserver"),
        serving_key,
        ca_name,
        ca_key,
        usages=(ExtendedKeyUsageOID.SERVER_AUTH,),
        sans=sans,
    )
    pki.serving_cert.write_bytes(serving.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.serving_key, serving_key)

    admin_key = _key()
    admin = _issue(
        _name("pagoda-admin", "system:masters"),
        admin_key,
        ca_name,
        ca_key,
        usages=(ExtendedKeyUsageOID.CLIENT_AUTH,),
    )
    pki.admin_cert.write_bytes(admin.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.admin_key, admin_key)
    issue_leaf(pki, pki.kubelet_client_cert, pki.kubelet_client_key, KUBELET_CLIENT, "system:masters")

    sa_key = _key()
    _write_key(pki.sa_key, sa_key)
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )

    # A CA of its own, as kubeadm does: extension API servers trust it only for the front proxy.
    fp_ca_key, fp_ca_name = _key(), _name("pagoda-local-front-proxy-ca")
    fp_ca = _issue(fp_ca_name, fp_ca_key, fp_ca_name, fp_ca_key, ca=True)
    pki.front_proxy_ca_cert.write_bytes(fp_ca.public_bytes(serialization.Encoding.PEM))
    fp_client_key = _key()
    fp_client = _issue(
        _name(FRONT_PROXY_CLIENT),
        fp_client_key,
        fp_ca_name,
        fp_ca_key,
        usages=(ExtendedKeyUsageOID.CLIENT_AUTH,),
    )
    pki.front_proxy_client_cert.write_bytes(fp_client.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.front_proxy_client_key, fp_client_key)
    return pki


def issue_leaf(
    pki: Pki,
    cert: Path,
    key: Path,
    common_name: str,
    org: str | None = None,
    *,
    server_ips: tuple[str, ...] = (),
) -> None:
    """A key and a certificate signed by the cluster CA: a client certificate (`common_name` is the user,
    `org` its group), or a serving one too when `server_ips` names the addresses it serves on."""
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    leaf_key = _key()
    usages: tuple[x509.ObjectIdentifier, ...] = (ExtendedKeyUsageOID.CLIENT_AUTH,)
    sans: list[x509.GeneralName] | None = None
    if server_ips:
        usages += (ExtendedKeyUsageOID.SERVER_AUTH,)
        sans = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
    leaf = _issue(_name(common_name, org), leaf_key, _name(CA_NAME), ca_key, usages=usages, sans=sans)
    cert.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    _write_key(key, leaf_key)


def write_kubeconfig(
    path: Path,
    server: str,
    pki: Pki,
    user: str = "pagoda-admin",
    cert: Path | None = None,
    key: Path | None = None,
) -> None:
    """A kubeconfig for `server` with a client certificate: the admin's, or `cert`/`key` as `user`."""
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: pagoda-local
  cluster:
    server: {server}
    certificate-authority: {pki.ca_cert}
users:
- name: {user}
  user:
    client-certificate: {cert or pki.admin_cert}
    client-key: {key or pki.admin_key}
contexts:
- name: pagoda-local
  context: {{cluster: pagoda-local, user: {user}}}
current-context: pagoda-local
"""
    )


def write_tls_dir(directory: Path, common_name: str, dns_names: list[str], ips: list[str]) -> TlsDir:
    """A fresh CA and one leaf certificate signed by it, for both server and client authentication (mutual
    TLS with a single certificate), with the given SANs; written as ca.crt, tls.crt, tls.key."""
    directory.mkdir(parents=True, exist_ok=True)
    tls = TlsDir(directory, directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    ca_key, ca_name = _key(), _name(f"{common_name}-ca")
    ca = _issue(ca_name, ca_key, ca_name, ca_key, ca=True)
    tls.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    leaf_key = _key()
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    leaf = _issue(
        _name(common_name),
        leaf_key,
        ca_name,
        ca_key,
        usages=(ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH),
        sans=sans,
    )
    tls.cert.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    _write_key(tls.key, leaf_key)
    return tls


class SecretVolume:
    """A kubernetes.io/tls Secret as the kubelet mounts it: tls.crt -> ..data/tls.crt, ..data -> a folder;
    an update (`write`) fills a new folder and renames a new ..data link over the old one (one atomic swap),
    as the kubelet does when cert-manager renews the Secret."""

    def __init__(self, root: Path) -> None:
        self.root, self.generation = root, 0
        root.mkdir()
        for name in ("tls.crt", "tls.key", "ca.crt"):
            (root / name).symlink_to(f"..data/{name}")

    @property
    def cert(self) -> str:
        """The path the runtime is given for --tls-cert-file (through the links, as in a pod)."""
        return str(self.root / "tls.crt")

    @property
    def key(self) -> str:
        return str(self.root / "tls.key")

    def write(self, source: TlsDir) -> None:
        self.generation += 1
        folder = self.root / f"..2026_12_05_{self.generation}"
        folder.mkdir()
        for name in ("tls.crt", "tls.key", "ca.crt"):
            (folder / name).write_bytes((source.directory / name).read_bytes())
        link = self.root / "..data_tmp"
        link.symlink_to(folder.name)
        os.replace(link, self.root / "..data")
