"""The promote task's copy of a checkpoint into a registry's folder: each file read once on the worker, hashed as its
bytes pass, and written to the destination, so what is registered is exactly what was read and proved.

A server-side copy cannot see bytes, so a checkpoint changed in storage after its experiment ended would be
registered and become the champion. Here every file is streamed (``get_object`` in parts, then one ``put_object``
for a small file or a multipart upload of the same parts for a large one: one part in memory at a time, no extra
download to hash) and its sha256 compared with the digest the experiment's sealed result records for it
(``best_checkpoint_files``). A file whose bytes differ is never completed at the destination, what was copied before
it is deleted, and the promotion fails naming the file, before any version, pointer, alias or tag is written.
boto3 is the caller's client; nothing here imports it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_tune.exceptions import PromotionError

#: Bytes read and uploaded at a time (S3's parts are at least 5 MiB but the last).
PART = 8 * 1024 * 1024
#: S3 takes at most this many parts per object: a larger file uses larger parts.
MAX_PARTS = 10_000


class CheckpointChanged(PromotionError):
    """A checkpoint's file is not, byte for byte, the one its trial wrote."""


def part_size(size: int) -> int:
    """The part size for an object of ``size`` bytes: :data:`PART`, or larger so it fits :data:`MAX_PARTS` parts."""
    needed = -(-max(size, 0) // MAX_PARTS)
    return max(PART, -(-needed // (1024 * 1024)) * 1024 * 1024)


def _read(body: Any, size: int) -> bytes:
    """Up to ``size`` bytes of the stream: fewer only at its end."""
    chunks, got = [], 0
    while got < size:
        chunk = body.read(size - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _stream_one(s3: Any, src_bucket: str, src_key: str, bucket: str, key: str, size: int, expected: str) -> str:
    """Copy one object through this process; the destination is completed only when its bytes hash to ``expected``.
    Returns the digest it computed (``sha256:<hex>``); raises :class:`CheckpointChanged` (the destination left
    without the object) when it differs."""
    body = s3.get_object(Bucket=src_bucket, Key=src_key)["Body"]
    hasher = hashlib.sha256()
    step = part_size(size)
    try:
        first = _read(body, step)
        hasher.update(first)
        if len(first) < step:  # the whole object is one part: checked before it is written
            digest = "sha256:" + hasher.hexdigest()
            if digest != expected:
                raise CheckpointChanged(digest)
            s3.put_object(Bucket=bucket, Key=key, Body=first)
            return digest
        upload = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        try:
            parts, number, chunk = [], 1, first
            while chunk:
                answer = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=chunk)
                parts.append({"ETag": answer["ETag"], "PartNumber": number})
                number += 1
                chunk = _read(body, step)
                hasher.update(chunk)
            digest = "sha256:" + hasher.hexdigest()
            if digest != expected:
                raise CheckpointChanged(digest)
            s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts})
            return digest
        except BaseException:
            s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload)
            raise
    finally:
        body.close()


def copy_proven(
    s3: Any,
    source_uri: str,
    objects: Sequence[Mapping[str, Any]],
    expected: Mapping[str, str],
    bucket: str,
    dest_prefix: str,
) -> list[dict[str, Any]]:
    """Copy the checkpoint's ``objects`` (listing entries with ``rel``) under ``s3://bucket/dest_prefix/``, each
    file's bytes hashed on the way and compared with ``expected`` (``{relative path: "sha256:<hex>"}``, the sealed
    result's ``best_checkpoint_files``).

    :raises PromotionError: the listed files are not the expected ones, or a file's bytes are not the trial's
        (naming it); everything this call wrote is deleted first.
    :return: ``[{"key": rel, "size": bytes, "digest": "sha256:..."}]`` of the files written.
    """
    from airflow_tune.common.provenance import CHECKPOINT_FILES_KEY
    from airflow_tune.registries.s3 import check_listing, split_s3_uri

    # The callers checked the listing before their gate; checked again where the bytes are written, by the same rule.
    check_listing({CHECKPOINT_FILES_KEY: dict(expected), "best_checkpoint_uri": source_uri}, objects)
    src_bucket, _ = split_s3_uri(source_uri)
    written: list[str] = []
    copied: list[dict[str, Any]] = []
    try:
        for obj in objects:
            rel, key = str(obj["rel"]), f"{dest_prefix}/{obj['rel']}"
            try:
                digest = _stream_one(s3, src_bucket, obj["Key"], bucket, key, int(obj.get("Size") or 0), expected[rel])
            except CheckpointChanged as exc:
                raise CheckpointChanged(
                    f"the checkpoint {source_uri} changed in storage after its trial wrote it: the bytes of {rel!r} "
                    f"read now ({exc}) are not the ones its experiment's sealed result records ({expected[rel]}); "
                    "not promoting it (nothing registered: run the experiment again, or find who writes its storage)"
                ) from None
            written.append(key)
            copied.append({"key": rel, "size": int(obj.get("Size") or 0), "digest": digest})
    except BaseException:
        for key in written:
            s3.delete_object(Bucket=bucket, Key=key)
        raise
    return copied
