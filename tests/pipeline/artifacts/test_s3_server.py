"""What the S3 backend relies on, checked on the test server itself: a conditional write
(``If-None-Match: *``) is atomic, so of several processes creating one key at the same
moment exactly one is told it succeeded.

moto's shipped server (``python -m moto.server``, one thread per request) does not give
that: it checks the condition and then writes, without a lock, so two racing writers can
both get 200 and the second silently replaces the first. The store tests therefore serve
moto's app one request at a time (``tests/helpers/s3_server.py``), which makes check-and-write
atomic as on Amazon S3.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import textwrap
import time
import uuid

import boto3
import pytest

from tests.helpers.s3_server import client_environment, moto_server

pytestmark = pytest.mark.system

RACERS = 8
ROUNDS_PER_BATCH = 30
# Each racer sleeps until the round's start time, then tries to create race/<round>.
_RACER = textwrap.dedent(
    """
    import json, sys, time
    import boto3, botocore.exceptions

    endpoint, bucket, me = sys.argv[1:4]
    start, rounds = float(sys.argv[4]), int(sys.argv[5])
    client = boto3.session.Session().client("s3", endpoint_url=endpoint)
    created = []
    for round_ in range(rounds):
        time.sleep(max(0.0, start + round_ * 0.15 - time.time()))
        try:
            key = f"race/{round_}"
            client.put_object(Bucket=bucket, Key=key, Body=me.encode(), IfNoneMatch="*")
            created.append(round_)
        except botocore.exceptions.ClientError as error:
            assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 412, error.response
    print(json.dumps(created))
    """
)


def _race(endpoint: str, rounds: int) -> tuple[dict[int, list[str]], dict[int, str]]:
    """``rounds`` keys raced for: who was told it created each one, and whose bytes it holds."""
    bucket = f"race-{uuid.uuid4().hex[:12]}"
    settings = client_environment(endpoint)
    client = boto3.session.Session(
        aws_access_key_id=settings["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=settings["AWS_SECRET_ACCESS_KEY"],
        region_name=settings["AWS_DEFAULT_REGION"],
    ).client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=bucket)
    start = time.time() + 4.0  # after every racer has imported boto3
    racers = {
        f"racer-{n}": subprocess.Popen(
            [
                *(sys.executable, "-c", _RACER, endpoint, bucket, f"racer-{n}"),
                *(str(start), str(rounds)),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, **client_environment(endpoint)),
        )
        for n in range(RACERS)
    }
    winners: dict[int, list[str]] = collections.defaultdict(list)
    try:
        for me, racer in racers.items():
            out, err = racer.communicate(timeout=120)
            assert racer.returncode == 0, err
            for round_ in json.loads(out):
                winners[round_].append(me)
    finally:
        for racer in racers.values():
            if racer.poll() is None:
                racer.kill()
                racer.wait(timeout=10)
    holders = {
        round_: client.get_object(Bucket=bucket, Key=f"race/{round_}")["Body"].read().decode()
        for round_ in winners
    }
    return dict(winners), holders


@pytest.mark.timeout(600)
def test_moto_threaded_server_lets_two_racing_conditional_writes_both_succeed():
    # A short GIL switch interval makes its request threads interleave often, as many
    # cores would; nothing else about the shipped server changes.
    with moto_server("threaded", switch_interval=1e-6) as endpoint:
        for _batch in range(10):
            winners, holders = _race(endpoint, ROUNDS_PER_BATCH)
            assert sorted(winners) == list(range(ROUNDS_PER_BATCH))  # never zero winners
            doubled = {round_: names for round_, names in winners.items() if len(names) > 1}
            if doubled:
                break
    assert doubled, f"no round of {10 * ROUNDS_PER_BATCH} had two winners"
    round_, names = next(iter(doubled.items()))
    # Both were told they created the key; the object holds only one of them: the other's
    # write was silently replaced. A version claimed this way would be lost.
    assert holders[round_] in names
    assert [name for name in names if name != holders[round_]]


@pytest.mark.timeout(300)
def test_the_test_server_gives_each_key_to_exactly_one_racer(s3_endpoint):
    winners, holders = _race(s3_endpoint, 10)
    assert sorted(winners) == list(range(10))
    assert all(len(names) == 1 for names in winners.values()), winners
    assert all(holders[round_] == names[0] for round_, names in winners.items())


@pytest.mark.timeout(60)
def test_a_server_that_does_not_listen_in_time_says_where_and_how_long_it_waited():
    # No server starts in a millisecond: the deadline passes, and the first try is the last.
    with pytest.raises(RuntimeError) as failed, moto_server(startup_timeout=0.001):
        pytest.fail("the server cannot have started")
    message = str(failed.value)
    assert re.fullmatch(
        r"moto's S3 server \(serial\) did not listen on 127\.0\.0\.1:\d+ within 0\.001 s; "
        r"its log ends:\n.*",
        message,
        flags=re.DOTALL,
    ), message
