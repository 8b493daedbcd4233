"""A strict ``multipart/form-data`` reader for the fake platform.

The Prime Traces upload is a two-part form whose ``traces`` part is binary
(gzip). The standard library's ``email`` parser normalises line endings and
decodes transfer encodings on its own terms, which would change the very bytes
whose digest the service verifies; this reader slices the body on the boundary
and hands every part's bytes back untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from email.message import Message

CRLF = b"\r\n"
HEADER_END = b"\r\n\r\n"


class MultipartError(ValueError):
    """The body is not well-formed ``multipart/form-data``."""


@dataclass(frozen=True)
class Part:
    """One form field: its headers (lower-cased names) and its exact bytes."""

    name: str
    data: bytes
    headers: dict[str, str] = field(default_factory=dict)
    filename: str | None = None

    @property
    def content_type(self) -> str | None:
        return self.headers.get("content-type")

    @property
    def content_encoding(self) -> str | None:
        return self.headers.get("content-encoding")


def boundary_of(content_type: str | None) -> str:
    """The boundary parameter of a ``multipart/form-data`` Content-Type."""
    if not content_type:
        raise MultipartError("the request has no Content-Type; expected multipart/form-data")
    header = _header_with_params("content-type", content_type)
    if header.get_content_type() != "multipart/form-data":
        raise MultipartError(
            f"Content-Type is {header.get_content_type()!r}; expected multipart/form-data"
        )
    boundary = header.get_param("boundary", header="content-type")
    if not isinstance(boundary, str) or not boundary:
        raise MultipartError("multipart/form-data Content-Type carries no boundary parameter")
    return boundary


def parse_form(content_type: str | None, body: bytes) -> list[Part]:
    """Every part of a ``multipart/form-data`` body, in order."""
    delimiter = b"--" + boundary_of(content_type).encode("latin-1")
    position = _first_delimiter_end(body, delimiter)
    parts: list[Part] = []
    while True:
        if body.startswith(b"--", position):
            return parts
        position = _skip_line_end(body, position)
        end = body.find(CRLF + delimiter, position)
        if end < 0:
            raise MultipartError("a part is not followed by a closing boundary")
        parts.append(_parse_part(body[position:end]))
        position = end + len(CRLF) + len(delimiter)


def _first_delimiter_end(body: bytes, delimiter: bytes) -> int:
    if body.startswith(delimiter):
        return len(delimiter)
    start = body.find(CRLF + delimiter)
    if start < 0:
        raise MultipartError("the body does not contain the declared boundary")
    return start + len(CRLF) + len(delimiter)


def _skip_line_end(body: bytes, position: int) -> int:
    """Past the CRLF that ends a delimiter line (RFC 2046 allows padding before it)."""
    while body[position : position + 1] in (b" ", b"\t"):
        position += 1
    if not body.startswith(CRLF, position):
        raise MultipartError("a boundary line is not terminated by CRLF")
    return position + len(CRLF)


def _parse_part(raw: bytes) -> Part:
    if raw.startswith(CRLF):
        header_block, data = b"", raw[len(CRLF) :]
    else:
        split = raw.find(HEADER_END)
        if split < 0:
            raise MultipartError("a part's headers are not terminated by an empty line")
        header_block, data = raw[:split], raw[split + len(HEADER_END) :]
    headers = _parse_headers(header_block)
    disposition = headers.get("content-disposition")
    if disposition is None:
        raise MultipartError("a part has no Content-Disposition header")
    parsed = _header_with_params("content-disposition", disposition)
    name = parsed.get_param("name", header="content-disposition")
    if parsed.get_content_disposition() != "form-data" or not isinstance(name, str):
        raise MultipartError(
            f"a part's Content-Disposition is not a named form-data field: {disposition!r}"
        )
    filename = parsed.get_param("filename", header="content-disposition")
    return Part(
        name=name,
        data=data,
        headers=headers,
        filename=filename if isinstance(filename, str) else None,
    )


def _parse_headers(block: bytes) -> dict[str, str]:
    headers: dict[str, str] = {}
    if not block:
        return headers
    for line in block.decode("utf-8", errors="replace").split("\r\n"):
        name, colon, value = line.partition(":")
        if not colon or not name.strip():
            raise MultipartError(f"malformed part header line: {line!r}")
        headers[name.strip().lower()] = value.strip()
    return headers


def _header_with_params(name: str, value: str) -> Message:
    """A throwaway message: ``email.message`` already knows RFC 2231 parameter quoting."""
    message = Message()
    message[name] = value
    return message
