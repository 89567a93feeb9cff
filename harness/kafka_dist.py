"""Apache Kafka's broker jars, fetched by Maven into a cache this set-up owns.

Apache Kafka ships no Python package and the machines reach no download site
but the package registries, so the broker comes from Maven Central: a small
generated POM depends on ``org.apache.kafka:kafka_2.13`` (the broker, its
KRaft controller and ``kafka-storage``) plus a log4j2 binding, and
``mvn dependency:copy-dependencies`` lays every runtime jar in one folder.
The cache lives under ``$KELP_CACHE_DIR`` (default ``~/.cache/kelp``), never
in the repository; a finished fetch leaves a stamp so later starts cost no
Maven run. A file lock makes concurrent first fetches (two test processes)
wait for one another instead of racing.

Run ``python -m kelp.harness.kafka_dist`` to fetch ahead of time (``make
test`` does, so the first Kafka test does not pay for it).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

from kelp.errors import MissingBinaryError

__all__ = [
    "KAFKA_VERSION",
    "cache_root",
    "ensure_kafka_jars",
    "ensure_maven_jars",
    "java_available",
    "maven_jars_cached",
]

KAFKA_VERSION = os.environ.get("KELP_KAFKA_VERSION", "4.1.1")
_LOG4J_VERSION = "2.24.3"
_SLF4J_VERSION = "2.0.17"  # Kafka 4 logs through slf4j 2; Maven's nearest-wins would pick metrics-core's 1.7

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.kelp.harness</groupId>
  <artifactId>apache-kafka-broker</artifactId>
  <version>{kafka}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>{slf4j}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>{log4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId><version>{log4j}</version></dependency>
  </dependencies>
</project>
"""


def cache_root() -> Path:
    """``$KELP_CACHE_DIR`` or ``~/.cache/kelp``: downloads the harness owns, outside any checkout."""
    return Path(os.environ.get("KELP_CACHE_DIR") or Path.home() / ".cache" / "kelp")


def java_available() -> bool:
    """True when a ``java`` runs here and the jars are cached or Maven can fetch them."""
    if shutil.which("java") is None:
        return False
    return maven_jars_cached(_libs(KAFKA_VERSION)) or shutil.which("mvn") is not None


def _libs(version: str) -> Path:
    return cache_root() / f"apache-kafka-{version}" / "libs"


def maven_jars_cached(libs: Path) -> bool:
    """True when :func:`ensure_maven_jars` finished laying jars in ``libs``."""
    return (libs.parent / "complete").is_file()


def ensure_maven_jars(libs: Path, pom: str, *, what: str, java_hint: str, quiet: bool = True) -> Path:
    """Every runtime jar of ``pom``'s dependencies in ``libs``, fetched by Maven the first time.

    ``what`` names the download in messages ("Apache Kafka 4.1.1"), ``java_hint`` the Java it needs.
    A stamp beside ``libs`` makes later calls cost no Maven run; a file lock makes concurrent first
    fetches (two test processes) wait for one another; a partial earlier fetch is thrown away.
    """
    if maven_jars_cached(libs):
        return libs
    if shutil.which("java") is None:
        raise MissingBinaryError(
            f"java not found: {what} needs {java_hint} (`apt-get install -y openjdk-17-jre-headless`)"
        )
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MissingBinaryError(f"mvn not found: {what} is fetched with Maven (`apt-get install -y maven`)")
    root = libs.parent
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if maven_jars_cached(libs):  # another process fetched while this one waited
            return libs
        (root / "pom.xml").write_text(pom)
        if libs.exists():
            shutil.rmtree(libs)
        argv = [
            mvn, "-B", "-f", str(root / "pom.xml"), "dependency:copy-dependencies",
            f"-DoutputDirectory={libs}", "-DincludeScope=runtime",
            f"-Dmaven.repo.local={cache_root() / 'maven-repository'}",
        ]  # fmt: skip
        if quiet:
            argv.insert(2, "-q")
        done = subprocess.run(argv, capture_output=quiet, text=True, timeout=900, check=False)
        if done.returncode != 0:
            tail = "\n".join(((done.stdout or "") + (done.stderr or "")).splitlines()[-15:])
            raise MissingBinaryError(f"fetching {what} with Maven failed:\n{tail}")
        (root / "complete").write_text(what + "\n")
    return libs


def ensure_kafka_jars(version: str = KAFKA_VERSION, *, quiet: bool = True) -> Path:
    """The folder of every jar the broker needs, fetching them with Maven the first time."""
    pom = _POM.format(kafka=version, log4j=_LOG4J_VERSION, slf4j=_SLF4J_VERSION)
    return ensure_maven_jars(
        _libs(version), pom, what=f"Apache Kafka {version}", java_hint="Java 17+", quiet=quiet
    )


def main() -> int:
    """Fetch the jars now; print where they are (used by ``make test``)."""
    if not java_available():
        print("kelp: java or mvn missing; the tests fall back to the Tansu broker", file=sys.stderr)
        return 0
    libs = ensure_kafka_jars(quiet=True)
    print(f"kelp: Apache Kafka {KAFKA_VERSION} jars in {libs}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
