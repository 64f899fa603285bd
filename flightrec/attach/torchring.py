"""torch's own Flight Recorder ring of a running process, asked for from outside.

torch 2.13 offers one way to read a running process' ring without running code in it: the
worker server that ``torch.distributed.elastic.control_plane.worker_main()`` starts when the
process was started with ``TORCH_WORKER_SERVER_SOCKET=PATH``. It is a C++ thread serving HTTP
on that Unix socket; its ``fr_trace_json`` handler returns the ring as PyTorch's JSON dump,
whatever the main thread is blocked in (a hung collective holds no lock it needs). The answer
is read as a native dump by ``flightrec.readers.native`` and merged into the snapshot.

What torch 2.13 does not offer (docs/attach.md): gloo has no dump trigger of its own; NCCL's
``TORCH_NCCL_DEBUG_INFO_PIPE_FILE`` and dump on timeout write where the job said, on the job's
schedule; Python 3.14's ``sys.remote_exec`` runs its script only when the target's main thread
next runs Python, which a rank blocked inside a collective never does until it fails.
"""

from __future__ import annotations

import socket

SOCKET_VARIABLE = "TORCH_WORKER_SERVER_SOCKET"
HANDLER = "fr_trace_json"
TIMEOUT_S = 5.0
MAX_BYTES = 512 * 1024 * 1024
"""As ``flightrec.readers.native.MAX_NATIVE_BYTES``: no ring is larger."""


class RingUnavailable(Exception):
    """The ring could not be read; the message is one line."""


def _request(handler: str) -> bytes:
    return (
        f"POST /handler/{handler} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n"
        "Connection: close\r\n\r\n"
    ).encode()


def _body(response: bytes) -> bytes:
    """The body of an HTTP/1.1 response with a status of 200.

    Raises:
        RingUnavailable: another status, or no complete response.
    """
    head, sep, body = response.partition(b"\r\n\r\n")
    if not sep:
        raise RingUnavailable("the worker server's answer ended before its headers did")
    lines = head.decode("latin-1").split("\r\n")
    status = lines[0].split(" ", 2)
    if len(status) < 2 or status[1] != "200":
        raise RingUnavailable(f"the worker server answered {' '.join(status[1:]) or '?'}")
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length" and value.strip().isdigit():
            if len(body) < int(value):
                raise RingUnavailable("the worker server's answer was cut short")
            return body[: int(value)]
    return body


def fetch_ring(path: str, timeout_s: float = TIMEOUT_S) -> bytes:
    """torch's ring as PyTorch's JSON dump, from the worker server listening at ``path``.

    Args:
        path: the Unix socket (the process' ``TORCH_WORKER_SERVER_SOCKET``).
        timeout_s: how long to wait for the whole answer.

    Returns:
        The JSON bytes.

    Raises:
        RingUnavailable: nothing listens there, or the answer is not a ring.
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(path)
            s.sendall(_request(HANDLER))
            chunks: list[bytes] = []
            size = 0
            while size <= MAX_BYTES:
                chunk = s.recv(1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
    except TimeoutError:
        raise RingUnavailable(
            f"its worker server at {path} did not answer in {timeout_s:g} s"
        ) from None
    except OSError as exc:
        raise RingUnavailable(
            f"no worker server answers at {path} ({exc.strerror or exc})"
        ) from None
    if size > MAX_BYTES:
        raise RingUnavailable(f"the worker server's answer is larger than {MAX_BYTES} bytes")
    return _body(b"".join(chunks))
