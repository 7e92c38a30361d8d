"""MinIO, the S3 API server the s3:// model source is tested against (built by `make tools`): a process on
the host with its data in a folder, on loopback (tier 3) or on the real node's address, where pods reach it
(tier 4)."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from minio import Minio

from e2e.lab.processes import ManagedProcess, free_port

USER = "pagoda-test"


@dataclass
class MinioServer(ManagedProcess):
    """`minio server` on a free port of `host` with its data in workdir/data."""

    workdir: Path
    bin_dir: Path
    host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    password: str = field(default_factory=lambda: secrets.token_hex(16))
    wrapper: list[str] = field(default_factory=list)  # e.g. `ip netns exec NS` (benchmarks/coldstart.py)

    name = "minio"
    STOP_GRACE = 20.0
    LOG_NAME = "minio.log"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> MinioServer:
        binary = self.bin_dir / "minio"
        if not os.access(binary, os.X_OK):
            raise FileNotFoundError(f"{binary} is missing: run `make tools` (or set PAGODA_BIN)")
        env = dict(os.environ, MINIO_ROOT_USER=USER, MINIO_ROOT_PASSWORD=self.password, MINIO_BROWSER="off")
        env["MINIO_UPDATE"] = "off"
        args = [*self.wrapper, str(binary), "server", "--quiet", "--address", f"{self.host}:{self.port}"]
        args += ["--console-address", f"127.0.0.1:{free_port()}", str(self.workdir / "data")]
        self.launch(args, env=env)
        self.wait_answers(f"{self.url}/minio/health/ready", "minio to be ready", timeout=60)
        return self

    def client(self, access: str = USER, secret: str | None = None) -> Minio:
        return Minio(
            f"{self.host}:{self.port}", access_key=access, secret_key=secret or self.password, secure=False
        )

    def upload(self, bucket: str, prefix: str, folder: Path) -> int:
        """Every file under `folder` as `prefix/<its path>` (the bucket made if missing); the bytes sent."""
        client = self.client()
        if not client.bucket_exists(bucket):
            client.make_bucket(bucket)
        total = 0
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            client.fput_object(bucket, f"{prefix}/{path.relative_to(folder).as_posix()}", str(path))
            total += path.stat().st_size
        return total
