"""notifier:webhook reaches only what it was allowed to: never an internal address by a name,
never a second, unchecked address (DNS rebinding), never through a redirect."""
from __future__ import annotations

import ipaddress
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from deadlines import notifiers
from deadlines.notifiers import NotifierError, webhook_notifier

CONTEXT = {"event": "deadline_missed", "dag_id": "etl", "run_id": "r1"}


class Server:
    """A real HTTP(S) server on 127.0.0.1 that records requests and answers `status` (and `location`)."""

    def __init__(self, status: int = 204, location: str = "", tls: ssl.SSLContext | None = None) -> None:
        self.requests: list[dict[str, str]] = []
        requests = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                requests.append({"path": self.path, "host": self.headers["Host"]})
                self.send_response(status)
                if location:
                    self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


@pytest.fixture
def dns(monkeypatch) -> dict[str, list[str]]:
    """Fake DNS for names in the returned dict (name -> addresses); real resolution otherwise.
    Every lookup of a fake name is counted in dns['lookups']."""
    records: dict[str, list[str]] = {"lookups": []}
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host in records and host != "lookups":
            records["lookups"].append(host)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)) for address in records[host]]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return records


def send(url: str) -> None:
    webhook_notifier(CONTEXT, timeout=5, url=url)


def test_it_posts_to_an_allowed_local_server_whose_address_is_listed(settings, server):
    """127.0.0.1 listed explicitly: the local test server gets the POST."""
    settings.ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    send(f"http://127.0.0.1:{server.port}/hook")
    assert server.requests == [{"path": "/hook", "host": f"127.0.0.1:{server.port}"}]


def test_it_refuses_a_name_that_resolves_to_loopback(settings, server, dns):
    """An allowed name is not enough to reach 127.0.0.1: the address itself must be listed."""
    settings.ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.com"]
    dns["hooks.example.com"] = ["127.0.0.1"]
    with pytest.raises(NotifierError, match="internal address 127.0.0.1") as refused:
        send(f"http://hooks.example.com:{server.port}/hook")
    assert refused.value.permanent
    assert server.requests == []


def test_it_refuses_localhost_by_name(settings, server):
    """The real resolver's localhost (127.0.0.1 or ::1) is refused the same way."""
    settings.ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS = ["localhost"]
    with pytest.raises(NotifierError, match="internal address"):
        send(f"http://localhost:{server.port}/hook")
    assert server.requests == []


@pytest.mark.parametrize("allowed", [["metadata.example.com"], ["metadata.example.com", "127.0.0.1"]])
def test_it_refuses_the_cloud_metadata_address(settings, dns, allowed):
    """169.254.169.254 by a name: refused before any connection is tried."""
    settings.ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS = allowed
    dns["metadata.example.com"] = ["169.254.169.254"]
    with pytest.raises(NotifierError, match="internal address 169.254.169.254"):
        send("http://metadata.example.com/latest/meta-data/")


def test_it_refuses_the_metadata_address_as_a_literal_not_listed(settings):
    settings.ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.com"]
    with pytest.raises(NotifierError, match="'169.254.169.254' is not in ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS"):
        send("http://169.254.169.254/latest/meta-data/")


def test_it_refuses_a_name_with_any_internal_address(settings, dns, server):
    """One public and one private address: refused, whichever would have been tried first."""
    settings.ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.com"]
    dns["hooks.example.com"] = ["93.184.216.34", "10.0.0.7"]
    with pytest.raises(NotifierError, match="internal address 10.0.0.7"):
        send("http://hooks.example.com/hook")


def test_it_does_not_follow_a_redirect_to_an_internal_address(settings):
    """A 302 to an internal server is an error; the internal server is never contacted."""
    internal = Server()
    redirector = Server(status=302, location=f"http://localhost:{internal.port}/admin")
    try:
        settings.ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
        with pytest.raises(NotifierError, match="answered HTTP 302: redirects are not followed") as refused:
            send(f"http://127.0.0.1:{redirector.port}/hook")
        assert not refused.value.permanent  # tried again later, never followed
        assert len(redirector.requests) == 1
        assert internal.requests == []
    finally:
        internal.close()
        redirector.close()


def test_it_connects_to_the_address_it_checked(settings, server, dns):
    """The name is resolved once; the connection goes to that address with the name as Host,
    so a DNS answer that changes between the check and the connection cannot be used."""
    settings.ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.com", "127.0.0.1"]
    dns["hooks.example.com"] = ["127.0.0.1"]
    send(f"http://hooks.example.com:{server.port}/hook?x=1")
    assert dns["lookups"] == ["hooks.example.com"]
    assert server.requests == [{"path": "/hook?x=1", "host": f"hooks.example.com:{server.port}"}]


@pytest.fixture
def certificate(tmp_path: Path) -> Path:
    """A self-signed certificate for hooks.example.com only (not for 127.0.0.1)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    cert = tmp_path / "hooks.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=hooks.example.com",
         "-addext", "subjectAltName=DNS:hooks.example.com", "-keyout", str(cert), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert


def test_it_speaks_tls_to_the_checked_address_with_the_name_for_sni_and_verification(settings, dns, certificate, monkeypatch):
    """HTTPS: connected to the checked 127.0.0.1, the certificate verified for hooks.example.com."""
    seen_sni: list[str | None] = []
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(certificate)
    tls.sni_callback = lambda sock, name, ctx: seen_sni.append(name)
    https = Server(tls=tls)
    try:
        settings.ORCHESTRATOR_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.com", "127.0.0.1"]
        dns["hooks.example.com"] = ["127.0.0.1"]
        monkeypatch.setenv("SSL_CERT_FILE", str(certificate))  # trust the test certificate
        webhook_notifier(CONTEXT, timeout=5, url=f"https://hooks.example.com:{https.port}/hook")
        assert seen_sni == ["hooks.example.com"]
        assert https.requests == [{"path": "/hook", "host": f"hooks.example.com:{https.port}"}]
    finally:
        https.close()


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "0.0.0.0", "100.64.0.1",
     "224.0.0.1", "240.0.0.1", "255.255.255.255", "::1", "::", "fe80::1", "fc00::1", "ff02::1", "::ffff:127.0.0.1",
     "::ffff:169.254.169.254"],
)  # fmt: skip
def test_it_counts_these_addresses_as_internal(address):
    assert notifiers.is_internal(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111"])
def test_it_counts_these_addresses_as_public(address):
    assert not notifiers.is_internal(ipaddress.ip_address(address))
