"""UmaDB's Python client against an Annals server, unchanged.

The server's gRPC address comes from ANNALS_GRPC_URL (the Rust test umadb_python_client starts
the server). The tests share one store, so each works in its own tag namespace and reads
positions relative to the head it finds.
"""

import os
import threading
import uuid

import pytest
import umadb
from umadb import AppendCondition, Client, Event, Query, QueryItem, TrackingInfo


@pytest.fixture(scope="module")
def client():
    with Client(os.environ["ANNALS_GRPC_URL"]) as c:
        yield c


def ns(name):
    return f"{name}-{uuid.uuid4().hex[:8]}"


def by_tag(*tags):
    return Query(items=[QueryItem(tags=list(tags))])


def positions(events):
    """Positions of a read's events (a read answers an iterable response)."""
    return [e.position for e in events]


def test_health_and_head(client):
    assert client.check_health() == umadb.ServingStatus.SERVING
    head = client.head()
    assert head is None or head >= 0


def test_append_and_read_with_start_backwards_limit(client):
    t = ns("course")
    first = client.append([Event(event_type="CourseDefined", tags=[t], data=b"10")])
    last = client.append(
        [Event(event_type="StudentSubscribed", tags=[t, f"{t}-s{i}"], data=b"") for i in range(4)]
    )
    assert last == first + 4
    assert client.head() >= last
    mine = list(client.read(query=by_tag(t)))
    assert positions(mine) == list(range(first, last + 1))
    assert mine[0].event.event_type == "CourseDefined"
    assert mine[0].event.data == b"10"
    assert mine[1].event.tags == [t, f"{t}-s0"]
    assert positions(client.read(query=by_tag(t), start=first + 2)) == list(range(first + 2, last + 1))
    assert positions(client.read(query=by_tag(t), start=first + 2, backwards=True)) == [
        first + 2, first + 1, first]
    assert positions(client.read(query=by_tag(t), limit=2)) == [first, first + 1]
    assert positions(client.read(query=by_tag(t), backwards=True, limit=2)) == [last, last - 1]
    assert positions(client.read(query=by_tag(t, f"{t}-s3"))) == [last]
    types = Query(items=[QueryItem(types=["CourseDefined"], tags=[t])])
    assert positions(client.read(query=types)) == [first]
    assert list(client.read(query=by_tag(ns("nobody")))) == []


def test_conditions_and_conflicts(client):
    t = ns("username")
    claim = AppendCondition(fail_if_events_match=by_tag(t))
    position = client.append([Event(event_type="UsernameClaimed", tags=[t], data=b"ada")], condition=claim)
    head_before = client.head()
    with pytest.raises(umadb.IntegrityError) as error:
        client.append([Event(event_type="UsernameClaimed", tags=[t], data=b"bob")], condition=claim)
    assert f"position {position}" in str(error.value)
    assert client.head() == head_before, "a failed condition appends nothing"
    # After the conflicting event, the same query no longer fails.
    later = AppendCondition(fail_if_events_match=by_tag(t), after=position)
    assert client.append([Event(event_type="UsernameReleased", tags=[t], data=b"")], condition=later) > position
    # `after` beyond the head is accepted.
    far = AppendCondition(fail_if_events_match=by_tag(ns("other")), after=10**9)
    assert client.append([Event(event_type="X", tags=[], data=b"")], condition=far) > 0


def test_retry_recognised_by_uuid(client):
    t = ns("invoice")
    event = Event(event_type="InvoiceCreated", tags=[t], data=b"1", uuid=uuid.uuid4())
    once = AppendCondition(fail_if_events_match=by_tag(t))
    first = client.append([event], condition=once)
    # The same append again: its condition fails on exactly its own event, so it is a retry.
    assert client.append([event], condition=once) == first
    assert len(list(client.read(query=by_tag(t)))) == 1
    # Another event with the same id but no condition is simply appended: an id is not a key.
    assert client.append([event]) > first
    assert len(list(client.read(query=by_tag(t)))) == 2
    other = Event(event_type="InvoiceCreated", tags=[t], data=b"2", uuid=uuid.uuid4())
    with pytest.raises(umadb.IntegrityError, match="(?i)integrity"):
        client.append([other], condition=once)


def test_tracking_info(client):
    source = ns("projection")
    assert client.get_tracking_info(source) is None
    client.append([Event(event_type="Projected", tags=[], data=b"")], tracking_info=TrackingInfo(source, 7))
    assert client.get_tracking_info(source) == 7
    with pytest.raises(umadb.IntegrityError):
        client.append([Event(event_type="Projected", tags=[], data=b"")], tracking_info=TrackingInfo(source, 7))
    assert client.get_tracking_info(source) == 7


def test_subscribe_catches_up_then_follows(client):
    t = ns("live")
    first = client.append([Event(event_type="Tick", tags=[t], data=b"0")])
    writer = Client(os.environ["ANNALS_GRPC_URL"])

    def append_more():
        for i in range(1, 30):
            writer.append([Event(event_type="Tick", tags=[t], data=str(i).encode())])

    subscription = client.subscribe(query=by_tag(t), after=first - 1)
    thread = threading.Thread(target=append_more)
    thread.start()
    seen = []
    for event in subscription:
        seen.append(event.event.data)
        if len(seen) == 30:
            break
    thread.join()
    writer.close()
    assert seen == [str(i).encode() for i in range(30)]


def test_a_data_subject_reads_back_until_erased(client):
    """The server keeps data subjects under customer: (ANNALS_HTTP_URL names it, for the
    erasure, which is an admin call over HTTP): the client reads a subject's event whole, and
    after the erasure with empty data and the flag annals.erased in its metadata; an append
    naming the erased subject is refused."""
    import json
    import urllib.request

    http = os.environ.get("ANNALS_HTTP_URL")
    if not http:
        pytest.skip("the server keeps no data subjects")
    subject = f"customer:{uuid.uuid4().hex[:8]}"
    position = client.append(
        [Event(event_type="AddressChanged", tags=[subject], data=b"MARKER 1 Main St",
               metadata={"source": "crm"})]
    )
    [event] = list(client.read(query=by_tag(subject)))
    assert event.position == position
    assert event.event.data == b"MARKER 1 Main St"
    assert event.event.metadata == {"source": "crm"}
    request = urllib.request.Request(
        f"{http}/v1/admin/erase",
        data=json.dumps({"tag": subject}).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request) as answer:
        assert json.load(answer)["events"] == 1
    erased, receipt = list(client.read(query=by_tag(subject)))
    assert erased.position == position
    assert erased.event.data == b""
    assert erased.event.metadata == {"annals.erased": "true"}
    assert erased.event.event_type == "AddressChanged"
    assert receipt.event.event_type == "annals.SubjectErased"
    with pytest.raises(Exception) as refused:
        client.append([Event(event_type="Moved", tags=[subject], data=b"x")])
    assert "subject_erased" in str(refused.value)
    assert not isinstance(refused.value, umadb.IntegrityError)


def test_an_event_that_breaks_its_schema_is_a_clear_error(client):
    """A schema registered for a type (an admin call over HTTP, ANNALS_HTTP_URL): an append
    through the client with an event that breaks it is refused whole with a message naming the
    event's index, its type, the schema version and the path in the event; nothing is stored;
    a valid one is stored."""
    import json
    import urllib.request

    http = os.environ.get("ANNALS_HTTP_URL")
    if not http:
        pytest.skip("no HTTP address to register a schema at")
    kind = ns("Registered")
    schema = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}
    request = urllib.request.Request(
        f"{http}/v1/admin/schemas/{kind}",
        data=json.dumps({"schema": schema}).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request) as answer:
        assert json.load(answer)["version"] == 1
    t = ns("schema")
    head = client.head()
    with pytest.raises(Exception) as refused:
        client.append([
            Event(event_type=kind, tags=[t], data=b'{"name": "ada"}'),
            Event(event_type=kind, tags=[t], data=b'{"name": 7}'),
        ])
    message = str(refused.value)
    assert "event 1" in message and f"{kind} v1" in message and "/name" in message, message
    assert not isinstance(refused.value, umadb.IntegrityError)
    assert client.head() == head, "a refused append stores nothing"
    assert list(client.read(query=by_tag(t))) == []
    client.append([Event(event_type=kind, tags=[t], data=b'{"name": "ada"}')])
    assert len(list(client.read(query=by_tag(t)))) == 1
