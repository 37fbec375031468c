"""A fault-injecting HTTPS proxy between Kubernetes clients and a real kube-apiserver.

The proxy listens on 127.0.0.1, terminates TLS with a serving certificate issued by the
control plane's own CA (so clients keep verifying with the kubeconfig's CA), and forwards
each request over TLS to the API server, verifying it with that CA. It speaks HTTP/1.1 with
keep-alive (one upstream connection per client connection, requests in order), and copies
request and response bodies byte for byte, whether they are framed by ``Content-Length`` or
chunked. Watch requests (``watch=true``) are streamed through untouched and never faulted.

Faults, armed at run time from any thread with :meth:`FaultProxy.inject`:

``drop_answer``
    forward the request, read the server's whole answer (the server has committed), then
    close the client connection without sending a byte of it.
``reset``
    close the client connection (TCP RST) before forwarding: nothing was committed.
``delay``
    forward, read the whole answer, hold it ``delay`` seconds (longer than the client's
    request timeout), then send it (``then="send"``) or drop it (``then="drop"``).
``status``
    answer 500, 503 or 429 without forwarding (503 and 429 carry ``Retry-After``).

Each fault has a filter (HTTP methods, a regular expression searched in the path) and fires
on the next ``count`` matching requests, or on each matching request with ``probability``,
or both (with probability, at most ``count`` times). Credentials pass through as the
``Authorization`` header; a client certificate cannot (TLS ends here), so use token
kubeconfigs, or give the proxy an upstream client certificate.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import random
import re
import select
import socket
import ssl
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import parse_qs, urlsplit

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from cryptography.x509.oid import ExtendedKeyUsageOID

from tests.testenv.pki import _issue, _name, _write_key

FAULT_KINDS = ("drop_answer", "reset", "delay", "status")
STATUS_REASONS = {500: "InternalError", 503: "ServiceUnavailable", 429: "TooManyRequests"}
_MAX_HEADER_LINE = 65536


class _Closed(Exception):
    """The peer closed the connection (or the proxy is stopping)."""


@dataclass
class Fault:
    """One armed fault; see the module docstring for the kinds."""

    kind: str
    count: int | None = None
    probability: float = 0.0
    methods: frozenset[str] | None = None
    path: re.Pattern[str] | None = None
    status: int | None = None
    retry_after: int = 1
    delay: float = 3.0
    then: str = "send"
    injected: int = 0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; expected one of {FAULT_KINDS}")
        if self.count is None and self.probability <= 0:
            raise ValueError("a fault needs a count (next N matching requests), a probability, or both")
        if self.status is not None and self.status not in STATUS_REASONS:
            raise ValueError(f"status must be one of {sorted(STATUS_REASONS)}, got {self.status}")
        if self.then not in ("send", "drop"):
            raise ValueError(f"then must be 'send' or 'drop', got {self.then!r}")

    def matches(self, method: str, path: str) -> bool:
        return (self.methods is None or method in self.methods) and (
            self.path is None or self.path.search(path) is not None
        )

    def exhausted(self) -> bool:
        return self.count is not None and self.injected >= self.count


@dataclass(frozen=True)
class Decision:
    """What the proxy does with one request (``kind`` None: forward it faithfully)."""

    kind: str | None = None
    status: int = 0
    retry_after: int = 0
    delay: float = 0.0
    then: str = "send"


@dataclass
class Event:
    """One request the proxy saw."""

    at: float
    method: str
    path: str
    fault: str | None
    upstream_status: int | None = None


@dataclass
class _Message:
    """A request or response head plus its body, as raw bytes ready to forward."""

    start_line: str
    headers: list[tuple[str, str]]
    raw: bytes = b""

    def header(self, name: str) -> str | None:
        wanted = name.lower()
        return next((value for key, value in self.headers if key.lower() == wanted), None)

    def wants_close(self) -> bool:
        return "close" in (self.header("Connection") or "").lower()


def _read_line(reader: BinaryIO) -> bytes:
    line = reader.readline(_MAX_HEADER_LINE)
    if not line:
        raise _Closed("connection closed")
    return line


def _read_head(reader: BinaryIO) -> tuple[bytes, _Message]:
    raw = _read_line(reader)
    while raw in (b"\r\n", b"\n"):  # tolerate stray blank lines between messages
        raw = _read_line(reader)
    start = raw.decode("latin-1").rstrip("\r\n")
    headers: list[tuple[str, str]] = []
    while True:
        line = _read_line(reader)
        raw += line
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
    return raw, _Message(start, headers)


def _read_exact(reader: BinaryIO, size: int) -> bytes:
    data = reader.read(size)
    if data is None or len(data) != size:
        raise _Closed("connection closed inside a body")
    return data


def _copy_body(reader: BinaryIO, message: _Message, *, has_body: bool, sink: Any = None) -> bytes:
    """Read the body framed as ``message`` says; return the raw framed bytes.

    With ``sink`` (a callable), each piece is passed on as soon as it arrives (streaming) and
    nothing is kept.
    """
    pieces: list[bytes] = []

    def emit(data: bytes) -> None:
        if sink is not None:
            sink(data)
        else:
            pieces.append(data)

    if not has_body:
        return b""
    if "chunked" in (message.header("Transfer-Encoding") or "").lower():
        while True:
            size_line = _read_line(reader)
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                trailer = size_line
                while True:
                    line = _read_line(reader)
                    trailer += line
                    if line in (b"\r\n", b"\n"):
                        break
                emit(trailer)
                break
            emit(size_line + _read_exact(reader, size + 2))
    elif message.header("Content-Length") is not None:
        length = int(message.header("Content-Length") or "0")
        if length:
            emit(_read_exact(reader, length))
    elif message.start_line.startswith("HTTP/"):  # a response without framing ends at EOF
        while True:
            data = reader.read1(65536) if hasattr(reader, "read1") else reader.read(65536)
            if not data:
                break
            emit(data)
        message.headers.append(("Connection", "close"))
    return b"".join(pieces)


def _is_watch(target: str) -> bool:
    split = urlsplit(target)
    values = parse_qs(split.query).get("watch", [])
    return any(value.lower() in ("true", "1") for value in values) or "/watch/" in split.path


def _hard_close(sock: socket.socket | None, *, reset: bool = False) -> None:
    if sock is None:
        return
    try:
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def issue_serving_certificate(ca_cert: Path, ca_key: Path, directory: Path) -> tuple[Path, Path]:
    """Issue a serving certificate for 127.0.0.1/localhost signed by the CA; return (cert, key) paths."""
    directory.mkdir(parents=True, exist_ok=True)
    issuer_cert = x509.load_pem_x509_certificate(ca_cert.read_bytes())
    issuer_key = load_pem_private_key(ca_key.read_bytes(), password=None)
    if not isinstance(issuer_key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"expected the testenv CA's EC key in {ca_key}, got {type(issuer_key).__name__}")
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = _issue(
        _name("kube-rendezvous-faultproxy"),
        key.public_key(),
        issuer_cert.subject,
        issuer_key,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH],
        sans=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    cert_path, key_path = directory / "faultproxy.crt", directory / "faultproxy.key"
    _write_key(key_path, key)
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


class FaultProxy:
    """The proxy; :meth:`start` it, point clients at :attr:`url`, :meth:`inject` faults, :meth:`stop` it.

    Args:
        upstream: the API server's URL (``https://127.0.0.1:PORT``).
        ca_cert: the control plane's CA certificate (verifies the API server; clients verify us with it).
        ca_key: that CA's key, to issue the proxy's serving certificate.
        workdir: where the serving certificate is written.
        upstream_client_cert: optional (cert, key) the proxy presents to the API server.
        seed: of the random choices (probabilistic faults, status codes).
    """

    def __init__(
        self,
        upstream: str,
        ca_cert: Path,
        ca_key: Path,
        workdir: Path,
        *,
        upstream_client_cert: tuple[Path, Path] | None = None,
        seed: int | None = None,
    ) -> None:
        split = urlsplit(upstream)
        if split.scheme != "https" or not split.hostname or not split.port:
            raise ValueError(f"upstream must be https://HOST:PORT, got {upstream!r}")
        self.upstream_host, self.upstream_port = split.hostname, split.port
        cert, key = issue_serving_certificate(ca_cert, ca_key, workdir)
        self._server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._server_context.load_cert_chain(str(cert), str(key))
        self._client_context = ssl.create_default_context(cafile=str(ca_cert))
        if upstream_client_cert is not None:
            self._client_context.load_cert_chain(str(upstream_client_cert[0]), str(upstream_client_cert[1]))
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self._faults: list[Fault] = []
        self._stopping = threading.Event()
        self._healed = threading.Event()
        self._healed.set()
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._threads: set[threading.Thread] = set()
        self._sockets: set[socket.socket] = set()
        self._ids = itertools.count()
        self.port = 0
        #: Counters: requests seen (all, and watches), faults injected by kind.
        self.requests = 0
        self.watches = 0
        self.faults: Counter[str] = Counter()
        #: Unexpected exceptions in connection threads (a proxy bug; the tests expect none).
        self.errors: list[str] = []
        #: Every request seen, in order (method, path, fault, upstream status).
        self.events: list[Event] = []

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        listener.settimeout(0.2)
        self._listener = listener
        self.port = int(listener.getsockname()[1])
        self._acceptor = threading.Thread(target=self._accept_loop, name="faultproxy-accept", daemon=True)
        self._acceptor.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, close every connection (waking blocked threads), join the threads."""
        self._stopping.set()
        if self._acceptor is not None:
            self._acceptor.join(timeout)
        with self._lock:
            sockets, threads = list(self._sockets), list(self._threads)
        for sock in sockets:
            _hard_close(sock)
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [thread.name for thread in threads if thread.is_alive()]
        if alive:
            raise RuntimeError(f"fault proxy threads did not stop: {alive}")

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults ------------------------------------------------------------------------------

    def inject(
        self,
        kind: str,
        *,
        count: int | None = None,
        probability: float = 0.0,
        methods: set[str] | frozenset[str] | tuple[str, ...] | None = None,
        path: str | None = None,
        status: int | None = None,
        retry_after: int = 1,
        delay: float = 3.0,
        then: str = "send",
    ) -> Fault:
        """Arm a fault (see the module docstring); it is checked after those armed before it."""
        fault = Fault(
            kind,
            count=count,
            probability=probability,
            methods=None if methods is None else frozenset(method.upper() for method in methods),
            path=None if path is None else re.compile(path),
            status=status,
            retry_after=retry_after,
            delay=delay,
            then=then,
        )
        with self._lock:
            self._faults.append(fault)
        return fault

    def partition(self) -> None:
        """Cut the clients off until :meth:`heal`: every open connection closes (watches too), and a new one is
        accepted and never answered (as through a network that drops every packet), so each request waits out its
        client's deadline."""
        with self._lock:
            self._healed.clear()
            sockets = list(self._sockets)
        for sock in sockets:
            _hard_close(sock)

    def heal(self) -> None:
        """End a :meth:`partition`: the connections it held unanswered close, and new ones are served again."""
        self._healed.set()

    @property
    def partitioned(self) -> bool:
        return not self._healed.is_set()

    def clear(self) -> None:
        """Disarm every fault (counters stay)."""
        with self._lock:
            self._faults.clear()

    def stats(self) -> dict[str, Any]:
        """Requests seen, watches, faults injected by kind, status codes injected, proxy errors (a snapshot)."""
        with self._lock:
            return {
                "requests": self.requests,
                "watches": self.watches,
                "faults": {kind: self.faults.get(kind, 0) for kind in FAULT_KINDS},
                "faults_by_method": dict(Counter(event.method for event in self.events if event.fault)),
                "status_codes": dict(
                    Counter(event.upstream_status for event in self.events if event.fault == "status")
                ),
                "proxy_errors": len(self.errors),
            }

    def _decide(self, method: str, target: str) -> Decision:
        path = urlsplit(target).path
        with self._lock:
            self.requests += 1
            watch = _is_watch(target)
            decision = Decision()
            if watch:
                self.watches += 1
            else:
                for fault in self._faults:
                    if fault.exhausted() or not fault.matches(method, path):
                        continue
                    if fault.probability > 0 and self._random.random() >= fault.probability:
                        continue
                    fault.injected += 1
                    status = fault.status or self._random.choice(sorted(STATUS_REASONS))
                    decision = Decision(fault.kind, status, fault.retry_after, fault.delay, fault.then)
                    self.faults[fault.kind] += 1
                    break
            self.events.append(
                Event(
                    time.monotonic(),
                    method,
                    path,
                    decision.kind,
                    decision.status if decision.kind == "status" else None,
                )
            )
            return decision

    # -- connections -------------------------------------------------------------------------

    def _track(self, sock: socket.socket | None, add: bool = True) -> None:
        if sock is None:
            return
        with self._lock:
            if add:
                self._sockets.add(sock)
            else:
                self._sockets.discard(sock)

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                break
            thread = threading.Thread(
                target=self._serve, args=(conn,), name=f"faultproxy-conn-{next(self._ids)}", daemon=True
            )
            with self._lock:
                self._threads = {item for item in self._threads if item.is_alive()}
                self._threads.add(thread)
            thread.start()
        self._listener.close()

    def _connect_upstream(self) -> ssl.SSLSocket:
        raw = socket.create_connection((self.upstream_host, self.upstream_port), timeout=10)
        upstream = self._client_context.wrap_socket(raw, server_hostname=self.upstream_host)
        upstream.settimeout(None)
        return upstream

    @staticmethod
    def _stale(sock: ssl.SSLSocket) -> bool:
        """An idle keep-alive connection the server has closed is readable (EOF) before we send."""
        if sock.pending():
            return True
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable)

    def _serve(self, raw_client: socket.socket) -> None:
        self._track(raw_client)
        if not self._healed.is_set():  # partitioned: hold the connection unanswered until healed (or stopped)
            while not self._healed.wait(0.2) and not self._stopping.is_set():
                pass
            self._track(raw_client, add=False)
            _hard_close(raw_client)
            return
        client: ssl.SSLSocket | None = None
        upstream: ssl.SSLSocket | None = None
        reader: BinaryIO | None = None
        upstream_reader: BinaryIO | None = None
        try:
            raw_client.settimeout(10)
            client = self._server_context.wrap_socket(raw_client, server_side=True)
            client.settimeout(None)
            self._track(client)
            reader = client.makefile("rb")
            while not self._stopping.is_set():
                head, request = _read_head(reader)
                body = _copy_body(reader, request, has_body=True)
                method, target = request.start_line.split(" ", 2)[:2]
                decision = self._decide(method, target)
                if decision.kind == "reset":
                    reader.close()  # the socket closes for real only once its file is closed
                    _hard_close(client, reset=True)
                    return
                if decision.kind == "status":
                    client.sendall(self._status_answer(decision))
                    if request.wants_close():
                        return
                    continue
                if upstream is not None and self._stale(upstream):
                    self._track(upstream, add=False)
                    if upstream_reader is not None:
                        upstream_reader.close()
                    _hard_close(upstream)
                    upstream = None
                if upstream is None or upstream_reader is None:
                    upstream = self._connect_upstream()
                    self._track(upstream)
                    upstream_reader = upstream.makefile("rb")
                upstream.sendall(head + body)
                response_head, response = _read_head(upstream_reader)
                status = int(response.start_line.split(" ", 2)[1])
                has_body = method != "HEAD" and status not in (204, 304) and not 100 <= status < 200
                if _is_watch(target):
                    client.sendall(response_head)
                    _copy_body(upstream_reader, response, has_body=has_body, sink=client.sendall)
                else:
                    answer = response_head + _copy_body(upstream_reader, response, has_body=has_body)
                    if decision.kind == "delay":
                        self._stopping.wait(decision.delay)
                        if decision.then == "drop" or self._stopping.is_set():
                            return
                    if decision.kind == "drop_answer":
                        return
                    client.sendall(answer)
                if request.wants_close() or response.wants_close():
                    return
        except (_Closed, OSError, ValueError):
            pass
        except Exception as exc:  # noqa: BLE001 - a proxy bug is recorded for the test, not lost in a thread
            with self._lock:
                self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            for stream in (reader, upstream_reader):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass
            _hard_close(upstream)
            _hard_close(client)
            _hard_close(raw_client)
            for sock in (upstream, client, raw_client):
                self._track(sock, add=False)

    @staticmethod
    def _status_answer(decision: Decision) -> bytes:
        code = decision.status
        reason = STATUS_REASONS[code]
        body = json.dumps(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"injected by the fault proxy ({code})",
                "reason": reason,
                "code": code,
            }
        ).encode()
        phrase = {500: "Internal Server Error", 503: "Service Unavailable", 429: "Too Many Requests"}[code]
        lines = [
            f"HTTP/1.1 {code} {phrase}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
        ]
        if code in (429, 503):
            lines.append(f"Retry-After: {decision.retry_after}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def proxy_kubeconfig(source: Path, proxy_url: str, destination: Path) -> Path:
    """Write a copy of kubeconfig ``source`` whose current cluster's server is ``proxy_url``.

    The credentials and the CA stay the same (the proxy's certificate is issued by that CA).
    """
    config: dict[str, Any] = yaml.safe_load(source.read_text())
    current = config.get("current-context")
    context = next(item["context"] for item in config["contexts"] if item["name"] == current)
    for cluster in config["clusters"]:
        if cluster["name"] == context["cluster"]:
            cluster["cluster"]["server"] = proxy_url
    destination.parent.mkdir(parents=True, exist_ok=True)
    destination.write_text(json.dumps(config, indent=2))
    destination.chmod(0o600)
    return destination
