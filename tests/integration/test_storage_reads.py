"""Reading a JSON file while it is replaced: pyarrow reads an S3 object as a HEAD for its size and then ranged GETs,
so a file replaced by a longer one in between came back cut short (``progress.json``, rewritten by the engine while
the trigger, the sensor and the Experiment view poll it; the sensor's poke failed on it). Against the session's real
S3 endpoint over HTTP."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from airflow_tune.common import storage

pytestmark = pytest.mark.usefixtures("stack")


def test_a_file_replaced_while_it_is_read_is_read_whole(stack):
    uri = f"s3://{stack.bucket}/torn-{uuid.uuid4().hex[:8]}/progress.json"
    storage.write_json(uri, {"i": -1, "pad": ""})
    written = [0]
    done = threading.Event()

    def rewrite() -> None:
        # Every write changes the file's length, as progress.json's rows do; 5 times as often as the engine's
        # fastest progress (progress_interval_s=0.5).
        while not done.is_set():
            storage.write_json(uri, {"i": written[0], "pad": "x" * (200 if written[0] % 2 else 4000)})
            written[0] += 1
            time.sleep(0.1)

    writer = threading.Thread(target=rewrite, daemon=True)
    writer.start()
    try:
        seen = set()
        for _ in range(100):
            seen.add(storage.read_json_or_none(uri)["i"])
            data, version = storage.read_json_if_changed(uri, None)
            assert isinstance(data, dict) and version is not None
            seen.add(storage.read_json(uri)["i"])
    finally:
        done.set()
        writer.join(timeout=10)
    # The reads overlapped the writes: many versions were seen, each read whole.
    assert written[0] >= 10 and len(seen) >= 5, (written[0], len(seen))


def test_a_file_that_does_not_parse_while_it_holds_still_is_an_error(stack):
    uri = f"s3://{stack.bucket}/malformed-{uuid.uuid4().hex[:8]}/progress.json"
    storage.write_bytes(uri, b'{"i": 1, "pad": "cut sh')
    with pytest.raises(ValueError):
        storage.read_json_or_none(uri)
    with pytest.raises(ValueError):
        storage.read_json_if_changed(uri, None)
    with pytest.raises(FileNotFoundError):
        storage.read_json(f"s3://{stack.bucket}/malformed-none/progress.json")
