"""moto's S3 server with S3's atomic conditional writes, for the object-store tests.

moto checks ``If-None-Match: *`` and then stores the object with no lock between the two, so two
concurrent creates of one key could both succeed, which S3 never allows: Delta commits rely on
exactly that refusal. Here writes (PUT, POST, DELETE) are applied one at a time, reads stay
concurrent.

Run: ``python s3_server.py --port N`` (binds 127.0.0.1 only).
"""

from __future__ import annotations

import argparse
import os
import threading
from collections.abc import Callable, Iterable

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import run_simple

WRITES = frozenset({"PUT", "POST", "DELETE"})

WsgiApp = Callable[[dict, Callable], Iterable[bytes]]


def atomic_writes(app: WsgiApp) -> WsgiApp:
    lock = threading.Lock()

    def serve(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ["REQUEST_METHOD"] not in WRITES:
            return app(environ, start_response)
        with lock:
            return list(app(environ, start_response))

    return serve


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    os.environ["MOTO_PORT"] = str(args.port)  # as moto's own server main sets it
    app = atomic_writes(DomainDispatcherApplication(create_backend_app))
    run_simple("127.0.0.1", args.port, app, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
