"""A real S3-compatible server for tests and benchmarks: moto's server (the s3 extra: ``pip install '.[s3]'`` in
a checkout) as a subprocess on 127.0.0.1, and buckets made with plain HTTP requests (moto takes unsigned ones)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass

START_TIMEOUT_S = 30.0


@dataclass
class S3Server:
    endpoint: str
    proc: subprocess.Popen[bytes]

    def options(self) -> dict[str, str]:
        """Lance's storage_options for this server (any key pair works on moto)."""
        return {
            "endpoint": self.endpoint,
            "allow_http": "true",
            "region": "us-east-1",
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
        }

    def new_bucket(self) -> str:
        name = f"t-{uuid.uuid4().hex[:16]}"
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{name}", method="PUT"), timeout=10).read()
        return name

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start_s3_server() -> S3Server:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/", timeout=1).read()
            return S3Server(endpoint, proc)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("moto's S3 server did not start") from None
            time.sleep(0.1)
