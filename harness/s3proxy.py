"""A real S3-protocol server for the row-snapshot tests: s3proxy on a filesystem backend.

Row snapshots go to S3-compatible object storage, and the tests must talk to
a server that speaks the real protocol (signed requests, paginated listings,
multi-object deletes) rather than a mock of boto3. s3proxy
(``org.gaul:s3proxy``, Apache-2.0) is such a server; it keeps objects as
plain files under a temporary directory (jclouds' ``filesystem`` provider).
Like the Kafka broker (:mod:`kelp.harness.kafka_dist`), it ships no Python
package and the machines reach no download site but the package registries,
so its runtime jars come from Maven Central into ``$KELP_CACHE_DIR`` through a
generated POM and ``mvn dependency:copy-dependencies``; a stamp makes later
starts cost no Maven run and a file lock makes concurrent first fetches wait
for one another.

Run ``python -m kelp.harness.s3proxy`` to fetch ahead of time.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from types import TracebackType

from kelp.harness.kafka_dist import cache_root, ensure_maven_jars, maven_jars_cached
from kelp.harness.ports import free_port, wait_for_port
from kelp.harness.process import ManagedProcess

__all__ = ["S3PROXY_VERSION", "S3ProxyServer", "ensure_s3proxy_jars", "s3proxy_available"]

S3PROXY_VERSION = "2.6.0"
_MAIN_CLASS = "org.gaul.s3proxy.Main"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.kelp.harness</groupId>
  <artifactId>s3proxy-server</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.gaul</groupId><artifactId>s3proxy</artifactId><version>{version}</version></dependency>
  </dependencies>
</project>
"""


def _libs(version: str) -> Path:
    return cache_root() / f"s3proxy-{version}" / "libs"


def s3proxy_available(version: str = S3PROXY_VERSION) -> bool:
    """True when a ``java`` runs here and the jars are cached or Maven can fetch them."""
    if shutil.which("java") is None:
        return False
    return maven_jars_cached(_libs(version)) or shutil.which("mvn") is not None


def ensure_s3proxy_jars(version: str = S3PROXY_VERSION, *, quiet: bool = True) -> Path:
    """The folder of every jar s3proxy needs, fetching them with Maven the first time."""
    return ensure_maven_jars(
        _libs(version),
        _POM.format(version=version),
        what=f"s3proxy {version}",
        java_hint="Java 11+",
        quiet=quiet,
    )


class S3ProxyServer:
    """s3proxy on 127.0.0.1 with one bucket, fixed credentials and objects kept in a temp dir.

    ``with S3ProxyServer() as s3:`` then point boto3 at :attr:`endpoint` with
    :attr:`access_key` / :attr:`secret_key` (:meth:`aws_env` gives both as
    the environment variables boto3 reads).
    """

    access_key = "kelp-s3proxy"
    secret_key = "kelp-s3proxy-secret"
    region = "us-east-1"

    def __init__(self, bucket: str = "kelp-snapshots", start_timeout_s: float = 120.0) -> None:
        self.bucket = bucket
        self.port = free_port()
        self.start_timeout_s = start_timeout_s
        self.workdir = Path(tempfile.mkdtemp(prefix="kelp-s3proxy-"))
        self._proc: ManagedProcess | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def aws_env(self) -> dict[str, str]:
        """The credentials boto3's default chain reads from the environment."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
        }

    def _properties(self, basedir: Path) -> Path:
        path = self.workdir / "s3proxy.properties"
        path.write_text(
            "\n".join(
                [
                    f"s3proxy.endpoint={self.endpoint}",
                    "s3proxy.authorization=aws-v2-or-v4",
                    f"s3proxy.identity={self.access_key}",
                    f"s3proxy.credential={self.secret_key}",
                    "jclouds.provider=filesystem",
                    f"jclouds.filesystem.basedir={basedir}",
                    "",
                ]
            )
        )
        return path

    def start(self) -> S3ProxyServer:
        libs = ensure_s3proxy_jars()
        basedir = self.workdir / "data"
        # jclouds' filesystem provider maps each directory under basedir to a bucket.
        (basedir / self.bucket).mkdir(parents=True)
        java = shutil.which("java") or "java"
        argv = [
            java, "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", f"{libs}/*", _MAIN_CLASS,
            "--properties", str(self._properties(basedir)),
        ]  # fmt: skip
        proc = ManagedProcess(argv, f"s3proxy-{self.port}", workdir=self.workdir)
        proc.start()
        self._proc = proc
        if not wait_for_port(self.port, self.start_timeout_s):
            tail = proc.log_tail()
            self.stop()
            raise RuntimeError(f"s3proxy did not listen on {self.port}:\n{tail}")
        return self

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None

    def cleanup(self) -> None:
        """Stop the server and delete every object it kept."""
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> S3ProxyServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()


def main() -> int:
    """Fetch the jars now; print where they are."""
    if not s3proxy_available():
        print("kelp: java or mvn missing; the S3 snapshot tests will be skipped", file=sys.stderr)
        return 0
    libs = ensure_s3proxy_jars(quiet=True)
    print(f"kelp: s3proxy {S3PROXY_VERSION} jars in {libs}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
