"""Receiving a multipart upload as a stream, straight into an encrypted spool.

The file part is never held in memory or written in clear: chunks go from the socket to
:class:`~app.storage.spool.EncryptedSpool` as they arrive, and the upload stops with 413
as soon as it passes the size limit. Small text fields (the ``schema`` JSON) are kept in
memory up to ``MAX_FIELD_BYTES``. Parts are routed by name: the part named ``file`` is
the data (``FILE_FIELD``); any other part is a text field, even when the client sent it
as a file (``curl -F schema=@schema.json``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from app.core.errors import InvalidRequest, PayloadTooLarge, UnsupportedMediaType
from app.core.threads import ThreadLimit
from app.storage.spool import EncryptedSpool
from app.storage.tables import KEY_RING_SEPARATOR

MAX_FIELD_BYTES = 1 << 20
MAX_FIELDS = 8
FILE_FIELD = "file"

#: Received files validated and stored at once. Each check reads the whole file and
#: writes it encrypted, for minutes (a graph's edge set as 25 MB of pair bits), on threads
#: counted apart from the request threadpool (:mod:`app.core.threads`): uploads beyond
#: the limit wait, holding their spooled file and nothing else.
MAX_CONCURRENT_UPLOAD_CHECKS = 4
upload_checks = ThreadLimit("curator_upload_checks", MAX_CONCURRENT_UPLOAD_CHECKS)


#: HKDF label of the key that fingerprints uploaded files (:func:`fingerprint_keys`): its
#: own, so that the fingerprint key is no other key derived from the data key.
FINGERPRINT_LABEL = b"curator upload fingerprint v1"


def fingerprint_keys(data_key: bytes) -> list[bytes]:
    """The keys that fingerprint an uploaded file, one per key of the data key ring
    (:func:`app.storage.tables.key_ring`), the current key's first: HKDF-SHA256 of each
    Fernet key's bytes with :data:`FINGERPRINT_LABEL`. A fingerprint is an HMAC-SHA256
    of the file's bytes under such a key, never a plain hash: a plain hash stored in the
    database would let anyone who reads it confirm a guessed table (DESIGN rule 5)."""
    return [
        HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=FINGERPRINT_LABEL).derive(
            base64.urlsafe_b64decode(key)
        )
        for key in data_key.split(KEY_RING_SEPARATOR)
    ]


@dataclass
class ReceivedUpload:
    fields: dict[str, str] = field(default_factory=dict)
    file: EncryptedSpool | None = None
    filename: str | None = None
    #: HMAC-SHA256 (hex) of the file's bytes under each of :func:`fingerprint_keys`, in
    #: its order, computed as the file was spooled; empty without a file part
    fingerprints: list[str] = field(default_factory=list)

    def discard(self) -> None:
        if self.file is not None:
            self.file.remove()


@dataclass
class _Part:
    headers: dict[bytes, bytes] = field(default_factory=dict)
    name: str = ""
    is_file: bool = False
    data: bytearray = field(default_factory=bytearray)


class _Receiver:
    def __init__(
        self, spool_dir: Path, max_file_bytes: int, fingerprint_keys: Sequence[bytes]
    ) -> None:
        self.upload = ReceivedUpload()
        self.macs = [hmac.new(key, digestmod=hashlib.sha256) for key in fingerprint_keys]
        self.spool_dir = spool_dir
        self.max_file_bytes = max_file_bytes
        self.part = _Part()
        self.header_name = b""
        self.header_value = b""
        self.pending_file_data: list[bytes] = []
        self.error: Exception | None = None

    def on_part_begin(self) -> None:
        self.part = _Part()

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self.header_name += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self.header_value += data[start:end]

    def on_header_end(self) -> None:
        self.part.headers[self.header_name.lower()] = self.header_value
        self.header_name = b""
        self.header_value = b""

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self.part.headers.get(b"content-disposition", b""))
        name = options.get(b"name")
        if name is None:
            raise InvalidRequest("a multipart part has no name")
        self.part.name = name.decode("utf-8", "replace")
        if self.part.name == FILE_FIELD:
            if self.upload.file is not None:
                raise InvalidRequest(f"send exactly one '{FILE_FIELD}' part")
            self.part.is_file = True
            self.upload.file = EncryptedSpool(self.spool_dir)
            self.upload.filename = options.get(b"filename", b"").decode("utf-8", "replace")
        elif len(self.upload.fields) >= MAX_FIELDS:
            raise InvalidRequest(f"too many form fields (at most {MAX_FIELDS})")

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        if self.part.is_file:
            self.pending_file_data.append(chunk)
        else:
            if len(self.part.data) + len(chunk) > MAX_FIELD_BYTES:
                raise PayloadTooLarge(
                    f"form field {self.part.name!r} is larger than {MAX_FIELD_BYTES} bytes"
                )
            self.part.data += chunk

    def on_part_end(self) -> None:
        if not self.part.is_file:
            try:
                self.upload.fields[self.part.name] = self.part.data.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidRequest(f"form field {self.part.name!r} is not UTF-8") from None

    def flush(self) -> None:
        spool = self.upload.file
        if spool is None or not self.pending_file_data:
            return
        data = b"".join(self.pending_file_data)
        self.pending_file_data.clear()
        if spool.size + len(data) > self.max_file_bytes:
            raise PayloadTooLarge(
                f"the file is larger than the limit of {self.max_file_bytes} bytes "
                "(CURATOR_MAX_UPLOAD_BYTES)"
            )
        spool.write(data)
        for mac in self.macs:
            mac.update(data)

    def finish(self) -> None:
        if self.upload.file is not None:
            self.upload.file.finish()
            self.upload.fingerprints = [mac.hexdigest() for mac in self.macs]


async def receive_multipart(
    request: Request,
    spool_dir: Path,
    max_file_bytes: int,
    fingerprint_keys: Sequence[bytes] = (),
) -> ReceivedUpload:
    """Stream a ``multipart/form-data`` body into fields and one encrypted file spool,
    fingerprinting the file's bytes as they are spooled (:attr:`ReceivedUpload.fingerprints`,
    one per key of ``fingerprint_keys``): the file is not read again for it."""
    content_type, params = parse_options_header(request.headers.get("content-type", ""))
    if content_type != b"multipart/form-data" or b"boundary" not in params:
        raise UnsupportedMediaType(
            "send multipart/form-data with a 'file' part and a 'schema' field"
        )
    declared_length = request.headers.get("content-length")
    if (
        declared_length
        and declared_length.isdigit()
        and int(declared_length) > max_file_bytes + MAX_FIELDS * MAX_FIELD_BYTES
    ):
        raise PayloadTooLarge(
            f"the request is larger than the upload limit of {max_file_bytes} bytes "
            "(CURATOR_MAX_UPLOAD_BYTES)"
        )
    receiver = _Receiver(spool_dir, max_file_bytes, fingerprint_keys)
    parser = MultipartParser(
        params[b"boundary"],
        {
            "on_part_begin": receiver.on_part_begin,
            "on_part_data": receiver.on_part_data,
            "on_part_end": receiver.on_part_end,
            "on_header_field": receiver.on_header_field,
            "on_header_value": receiver.on_header_value,
            "on_header_end": receiver.on_header_end,
            "on_headers_finished": receiver.on_headers_finished,
        },
    )
    try:
        async for chunk in request.stream():
            parser.write(chunk)
            await run_in_threadpool(receiver.flush)
        parser.finalize()
        await run_in_threadpool(receiver.flush)
        receiver.finish()
    except FormParserError:
        receiver.upload.discard()
        raise InvalidRequest("the multipart body is malformed") from None
    except BaseException:
        receiver.upload.discard()
        raise
    return receiver.upload
