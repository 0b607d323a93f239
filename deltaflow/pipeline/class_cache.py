"""A class-data sharing archive for the driver JVM that deltaflow starts: Spark starts faster.

A fresh Spark driver spends most of its start-up loading and verifying classes from some 250
jars (seconds of CPU before the session exists, and again before its first job). The JVM can
save the classes a run loaded into an archive (``-XX:ArchiveClassesAtExit``, a "dynamic CDS
archive") and map that archive at the next start (``-XX:SharedArchiveFile``) instead of
loading them again; BENCHMARKS.md has the measured difference.

How the archive is made safe to use:

* Its name is a hash of what it depends on (the ``java`` binary, pyspark's jars, the extra
  class path settings): another Java or Spark gets an archive of its own. The JVM also checks
  the class path itself and ignores an archive that does not match (``-Xshare:auto``).
* A JVM writes the archive when it exits. An archive cut short (a JVM killed while writing)
  crashes the next JVM that maps it, so a JVM writes ``<name>.<pid>-<random>.partial``, and
  only the process that started it renames it to ``<name>.jsa``, after the JVM exited with
  status 0 and the file was synced to disk (:meth:`ClassCache.finish`, at interpreter exit). A
  partial file is never mapped.
* ``DELTAFLOW_JVM_CLASS_CACHE=off`` turns it off; it is never used when the JVM was started by
  someone else (spark-submit), the Java options already name a CDS archive, or the driver's
  class path holds a non-empty folder (a ``SPARK_CONF_DIR`` with files: the JVM archives only
  classes from jars, and refuses otherwise).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ENV_VAR", "ClassCache", "class_cache"]

logger = logging.getLogger(__name__)

#: ``off`` (or ``0``, ``false``, ``no``) disables the archive.
ENV_VAR = "DELTAFLOW_JVM_CLASS_CACHE"
#: Archives of other Java or Spark installations kept besides the current one.
_KEEP_OTHERS = 2
#: A partial archive this old whose process is gone was never finished (the JVM writes it in
#: about a second).
_STALE_PARTIAL_S = 120.0
#: How long the interpreter's exit waits for the JVM to write the archive.
_EXIT_WAIT_S = 60.0
_QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")
#: Smaller than any archive of a Spark driver (~100-170 MB measured): not one.
_MIN_SIZE = 1024 * 1024


@dataclass(frozen=True)
class ClassCache:
    """The archive for one JVM start: map it if it exists, else have the JVM write it."""

    archive: Path
    #: True when this start writes the archive (none existed when it was planned).
    writes: bool
    #: Names this start's partial archive: ``<pid>-<random>`` (pids repeat across containers
    #: that share a cache folder).
    token: str = field(default_factory=lambda: f"{os.getpid()}-{uuid.uuid4().hex[:8]}")

    @property
    def partial(self) -> Path:
        return self.archive.with_name(f"{self.archive.stem}.{self.token}.partial")

    def java_options(self) -> list[str]:
        if self.writes:
            return [f"-XX:ArchiveClassesAtExit={self.partial}", *_QUIET]
        return [f"-XX:SharedArchiveFile={self.archive}", "-Xshare:auto", *_QUIET]

    def finish(self, jvm: subprocess.Popen[bytes] | None) -> None:
        """Once the JVM exited cleanly, make its archive the one later starts map.

        Called at interpreter exit: closing the JVM's stdin ends it (pyspark's gateway exits
        on end of input), then this waits for it to write the archive.
        """
        partial = self.partial
        if jvm is None or not partial.parent.exists():
            return
        try:
            if jvm.stdin is not None:
                jvm.stdin.close()
            status = jvm.wait(timeout=_EXIT_WAIT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            logger.debug("no JVM class archive: the JVM did not exit (%s)", exc)
            status = None
        try:
            if status == 0 and partial.exists() and partial.stat().st_size >= _MIN_SIZE:
                _sync(partial)  # a power cut must not leave a named archive cut short
                partial.replace(self.archive)
                _sync(self.archive.parent)
                logger.info("saved the JVM class archive %s: later Spark starts are faster", self.archive)
            else:
                partial.unlink(missing_ok=True)
        except OSError as exc:
            logger.info("no JVM class archive (%s)", exc)


def class_cache(settings: Mapping[str, str], *, cache_dir: Path | None = None) -> ClassCache | None:
    """The archive for a driver JVM started with ``settings``, or None when not to use one."""
    if os.environ.get(ENV_VAR, "").strip().lower() in {"off", "0", "false", "no"}:
        return None
    options = settings.get("spark.driver.extraJavaOptions", "")
    if any(flag in options for flag in ("SharedArchiveFile", "ArchiveClassesAtExit", "-Xshare")):
        return None
    if _without_compressed_oops(settings):
        # An archive written with compressed object pointers is refused by a JVM without them
        # (ZGC, a heap of 32 GiB or more), and a refused archive starts slower than none.
        logger.info("no JVM class archive: the driver JVM runs without compressed object pointers")
        return None
    key = _key(settings)
    if key is None:
        return None
    folder_on_path = _non_empty_folder_on_class_path(settings)
    if folder_on_path is not None:  # the JVM refuses to archive then, and says so on stdout
        logger.info("no JVM class archive: the driver's class path holds the folder %s", folder_on_path)
        return None
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = cache_dir or cache_home / "deltaflow" / "jvm"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _tidy(folder, keep=f"spark-classes-{key}")
    except OSError as exc:
        logger.info("no JVM class archive (%s)", exc)
        return None
    archive = folder / f"spark-classes-{key}.jsa"
    if any(c.isspace() or c in "'\"\\" for c in str(archive)):
        logger.info("no JVM class archive: Spark splits Java options at blanks, and %s has one", folder)
        return None
    return ClassCache(archive, writes=not archive.exists())


#: Java options and variables that make a driver JVM run without compressed object pointers.
_NO_COMPRESSED_OOPS = re.compile(r"-XX:\+UseZGC\b|-XX:-UseCompressedOops\b")
#: Environment variables whose Java options the driver JVM also takes.
JAVA_OPTION_VARIABLES = ("SPARK_SUBMIT_OPTS", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS")
_UNITS = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}


def _without_compressed_oops(settings: Mapping[str, str]) -> bool:
    texts = [
        settings.get("spark.driver.extraJavaOptions", ""),
        settings.get("spark.driver.defaultJavaOptions", ""),
    ]
    texts += [os.environ.get(name, "") for name in JAVA_OPTION_VARIABLES]
    if any(_NO_COMPRESSED_OOPS.search(text) for text in texts):
        return True
    memory = re.fullmatch(r"\s*(\d+)\s*([kmgt])?b?\s*", settings.get("spark.driver.memory", "").lower())
    if memory is None:
        return False
    return int(memory[1]) * _UNITS[memory[2] or "m"] >= 32 * 1024  # MiB


def _key(settings: Mapping[str, str]) -> str | None:
    """A hash of the JVM binary and the driver's class path (None: no Java or pyspark found)."""
    try:
        import pyspark

        home = os.environ.get("JAVA_HOME")
        java = Path(home) / "bin" / "java" if home else Path(shutil.which("java") or "")
        java = java.resolve(strict=True)
        jars = Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent) / "jars"
        # The jars' folder too: an archive made with another class path is refused by the JVM,
        # and a refused archive makes it start slower than none (measured: 10-13 s against 7-8 s).
        parts = [str(java), str(java.stat().st_mtime_ns), pyspark.__version__, str(jars.resolve())]
        parts += sorted(f"{p.name}:{p.stat().st_size}" for p in jars.glob("*.jar"))
    except (OSError, ImportError):
        return None
    for name in ("spark.driver.extraClassPath", "spark.jars", "spark.jars.packages"):
        parts.append(f"{name}={settings.get(name, '')}")
    parts.append(f"SPARK_CONF_DIR={os.environ.get('SPARK_CONF_DIR', '')}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _non_empty_folder_on_class_path(settings: Mapping[str, str]) -> str | None:
    """A non-empty folder on the driver's class path (Spark's conf folder, extra entries)."""
    import pyspark

    home = os.environ.get("SPARK_HOME") or str(Path(pyspark.__file__).parent)
    entries = [os.environ.get("SPARK_CONF_DIR") or os.path.join(home, "conf")]
    entries += settings.get("spark.driver.extraClassPath", "").split(os.pathsep)
    for entry in filter(None, entries):
        path = Path(entry)
        try:
            if path.is_dir() and any(path.iterdir()):
                return entry
        except OSError:
            return entry
    return None


def _tidy(folder: Path, keep: str) -> None:
    """Drop partial archives of processes long gone and all but the newest other archives."""
    now = time.time()
    for partial in folder.glob("*.partial"):
        token = partial.suffixes[-2].lstrip(".") if len(partial.suffixes) >= 2 else ""
        pid = token.split("-")[0]
        if now - partial.stat().st_mtime > _STALE_PARTIAL_S and not _alive(pid):
            partial.unlink(missing_ok=True)
    others = sorted(
        (p for p in folder.glob("spark-classes-*.jsa") if p.stem != keep),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in others[_KEEP_OTHERS:]:
        old.unlink(missing_ok=True)


def _sync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _alive(pid: str) -> bool:
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True
