"""deltaflow.testing's fault proxy, against a real S3 (moto) through boto3 with its retries off."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from deltaflow.testing import FaultyHttpProxy


@pytest.fixture
def proxy(s3) -> Iterator[FaultyHttpProxy]:  # type: ignore[no-untyped-def]
    with FaultyHttpProxy(s3.endpoint) as p:
        yield p


def _client(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
        config=Config(
            retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=5, read_timeout=30
        ),
    )


def _exists(client: Any, key: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        client.head_object(Bucket="lake", Key=key)
        return True
    except ClientError:
        return False


def test_fail_answers_instead_of_forwarding(proxy, s3):  # type: ignore[no-untyped-def]
    from botocore.exceptions import ClientError

    via, direct = _client(proxy.endpoint), _client(s3.endpoint)
    key = f"proxy/{uuid.uuid4().hex}"
    proxy.fail("PUT", r"/proxy/", 503, times=1)
    with pytest.raises(ClientError, match="SlowDown"):
        via.put_object(Bucket="lake", Key=key, Body=b"x")
    assert not _exists(direct, key)  # the store never saw it
    via.put_object(Bucket="lake", Key=key, Body=b"x")  # times=1: the next one passes
    assert direct.get_object(Bucket="lake", Key=key)["Body"].read() == b"x"
    assert proxy.counts["fail"] == 1 and proxy.injected == 1


def test_lose_response_forwards_then_reports_an_error(proxy, s3):  # type: ignore[no-untyped-def]
    from botocore.exceptions import ClientError

    via, direct = _client(proxy.endpoint), _client(s3.endpoint)
    key = f"lost/{uuid.uuid4().hex}"
    proxy.lose_response("PUT", r"/lost/", 500)
    with pytest.raises(ClientError, match="InternalError"):
        via.put_object(Bucket="lake", Key=key, Body=b"landed")
    # The write landed although its client was told it failed.
    assert direct.get_object(Bucket="lake", Key=key)["Body"].read() == b"landed"
    assert proxy.counts["lose_response"] == 1
    # Other methods and paths are not affected.
    proxy.lose_response("PUT", r"/lost/", 500, times=-1)
    assert via.get_object(Bucket="lake", Key=key)["Body"].read() == b"landed"


def test_reset_before_and_after_forwarding(proxy, s3):  # type: ignore[no-untyped-def]
    from botocore.exceptions import ConnectionClosedError, EndpointConnectionError

    connection_errors = (ConnectionClosedError, EndpointConnectionError, ConnectionError)
    via, direct = _client(proxy.endpoint), _client(s3.endpoint)
    before, after = f"reset/{uuid.uuid4().hex}", f"reset/{uuid.uuid4().hex}"
    proxy.reset("PUT", before)
    with pytest.raises(connection_errors):
        via.put_object(Bucket="lake", Key=before, Body=b"x")
    assert not _exists(direct, before)
    proxy.reset("PUT", after, after_forward=True)
    with pytest.raises(connection_errors):
        via.put_object(Bucket="lake", Key=after, Body=b"x")
    assert _exists(direct, after)
    assert proxy.counts["reset"] == 2


def test_delay_outage_and_heal(proxy, s3):  # type: ignore[no-untyped-def]
    from botocore.exceptions import ClientError

    via = _client(proxy.endpoint)
    key = f"slow/{uuid.uuid4().hex}"
    proxy.delay("*", "/slow/", 0.5, times=1)
    started = time.monotonic()
    via.put_object(Bucket="lake", Key=key, Body=b"x")
    assert time.monotonic() - started >= 0.5
    assert proxy.counts["delay"] == 1

    proxy.outage(status=503)
    for _ in range(3):
        with pytest.raises(ClientError):
            via.head_object(Bucket="lake", Key=key)
    proxy.heal()
    assert via.head_object(Bucket="lake", Key=key)["ContentLength"] == 1
    assert ("HEAD", f"/lake/{key}") in proxy.requests


def test_batched_produce_leaves_no_tail_hidden_from_the_broker(kafka):  # type: ignore[no-untyped-def]
    from confluent_kafka import Consumer, TopicPartition

    topic = kafka.create_topic(partitions=3)
    values = [b"v%d" % i for i in range(3001)]
    kafka.produce(topic, values, partitions=3, batched=True)
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "tail-check"})
    try:
        highs = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(3)]
        assert highs == [1001, 1000, 1000]  # tansu reports every record: no marker needed
        consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
        seen: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(seen) < len(values) and time.monotonic() < deadline:
            seen += [m.value() for m in consumer.consume(1000, timeout=1) if m.error() is None]
    finally:
        consumer.close()
    assert sorted(seen) == sorted(values)
