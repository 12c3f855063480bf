"""What the engine vouches for in its job log (see :mod:`airflow_tune.common.provenance`): the bytes of the result
manifest it writes, which name the content digests of the best checkpoint's files.

The digests are taken once, when the experiment ends, by reading the best checkpoint from storage on the driver; the
result is sealed right after it is written, so a reader that finds the file with another digest knows storage was
changed after the job wrote it.
"""

from __future__ import annotations

from typing import Any

from airflow_tune.common import jsonsafe, storage
from airflow_tune.common.contract import digest_of
from airflow_tune.common.provenance import CHECKPOINT_DIGEST_KEY, CHECKPOINT_FILES_KEY, files_digest, seal_text
from airflow_tune.engine.log_lines import emit


def record_checkpoint_digests(manifest: dict[str, Any]) -> None:
    """Put the best checkpoint's content digests (and their one digest) in the result manifest."""
    uri = manifest.get("best_checkpoint_uri")
    files = storage.file_digests(str(uri)) if uri else None
    manifest[CHECKPOINT_FILES_KEY] = files
    manifest[CHECKPOINT_DIGEST_KEY] = files_digest(files) if files else None


def write_sealed(uri: str, name: str, data: Any) -> str:
    """Write ``data`` as the manifest ``name`` at ``uri`` and vouch for its bytes in the job log; return the digest."""
    body = jsonsafe.dumps(data, indent=1, sort_keys=True).encode()
    storage.write_bytes(uri, body)
    digest = digest_of(body)
    emit(seal_text(name, digest))
    return digest
