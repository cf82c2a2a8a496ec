"""``amq spark pack-env``: a slim, relocatable Python env to ship to executors with ``--archives``.

Theory of operation
-------------------
An executor whose Python lacks this library cannot unpickle the ``amq`` data source.
``--py-files`` cannot fix that (it ignores a ``.whl``, and a zip cannot carry
pydantic-core or pyarrow, which are compiled), so the library travels as an archive
that Spark unpacks in every executor's working directory:

1. the wheel: given (``--wheel``), or built from the source checkout this package runs
   from (``pip wheel --no-deps``);
2. ``pip install --target ENV/site-packages "<wheel>[spark-executor]"``: the library,
   its dependencies and pyarrow, and **no pyspark** (Spark puts its own ``pyspark.zip``
   on the workers' ``PYTHONPATH``): about 72 MB packed where a venv with pyspark is
   over 500 MB;
3. ``ENV/bin/python``: a ``sh`` launcher, not a venv's symlink. A venv's interpreter is
   an absolute symlink to the build machine's Python, so a packed venv runs only where
   that exact path exists. The launcher instead runs the node's own ``python3.X`` (the
   build's minor version: the compiled wheels are built for it), found on ``PATH`` or
   named by ``$AMQ_ENV_PYTHON``, with ``ENV/site-packages`` first on ``PYTHONPATH``. It
   finds its directory at run time, so the env works wherever it is unpacked;
4. the check: the launcher, run from another directory, imports the library *from the
   env*;
5. ``ENV.tar.gz`` with ``bin/`` and ``site-packages/`` at its root (so ``#env`` unpacks
   to ``env/bin/python``), and the ``spark-submit`` line.

Client mode (standalone's only mode for Python, YARN's default): the driver JVM also
starts Python workers (to plan the data source's writes) with the same
``PYSPARK_PYTHON``, resolved in the submit directory. The line therefore runs
spark-submit from the output directory, where the unpacked ``env/`` sits next to the
archive.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from amqtransport.errors import AmqTransportError

__all__ = [
    "LAUNCHER_ENV_VAR",
    "PackEnvError",
    "PackedEnv",
    "build_wheel",
    "launcher_text",
    "pack_env",
    "source_checkout",
    "submit_line",
]

#: Environment variable naming the node's interpreter for the launcher (default ``python3.X``).
LAUNCHER_ENV_VAR = "AMQ_ENV_PYTHON"


class PackEnvError(AmqTransportError, RuntimeError):
    """pack-env cannot go on; the message says what to do."""


@dataclass(frozen=True)
class PackedEnv:
    env_dir: Path
    archive: Path
    wheel: Path
    interpreter: str
    env_bytes: int
    archive_bytes: int
    checked_with: str  # the interpreter the launcher check ran with

    def submit_line(self, master: str = "spark://HOST:7077", app: str = "/path/to/your_job.py") -> str:
        return submit_line(self.archive, master=master, app=app)


def source_checkout() -> Path | None:
    """The project directory when this package runs from a source checkout (editable install)."""
    root = Path(__file__).resolve().parents[2]
    pyproject = root / "pyproject.toml"
    if pyproject.exists() and 'name = "amqtransport"' in pyproject.read_text(encoding="utf-8"):
        return root
    return None


def _run(cmd: Sequence[str], what: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(cmd), capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise PackEnvError(f"{what} failed (exit {done.returncode}): {' '.join(cmd)}\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done  # type: ignore[no-any-return]


def build_wheel(source: Path, wheel_dir: Path, python: str = sys.executable) -> Path:
    """``pip wheel --no-deps`` of the project at ``source`` into ``wheel_dir``; the wheel's path."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    before = set(wheel_dir.glob("amqtransport-*.whl"))
    _run([python, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(wheel_dir), str(source)],
         "building the wheel")
    wheels = sorted(wheel_dir.glob("amqtransport-*.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise PackEnvError(f"pip wheel left no amqtransport-*.whl in {wheel_dir}")
    new = [w for w in wheels if w not in before]
    return (new or wheels)[-1]


def launcher_text(interpreter: str) -> str:
    """The ``sh`` script that stands in for ``bin/python`` in the packed env."""
    return f"""#!/bin/sh
# Written by `amq spark pack-env`. Runs this node's {interpreter} (or ${LAUNCHER_ENV_VAR})
# with the packed libraries first on PYTHONPATH. No path from the build machine: the
# env works wherever it is unpacked, on any node with a {interpreter} on PATH.
env_dir=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd) || exit 1
PYTHONPATH="$env_dir/site-packages${{PYTHONPATH:+:$PYTHONPATH}}"
export PYTHONPATH
exec "${{{LAUNCHER_ENV_VAR}:-{interpreter}}}" "$@"
"""


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def _check(env_dir: Path, interpreter: str) -> str:
    """Run the launcher from elsewhere; it must import the library from the env. Returns the interpreter used."""
    probe = "import sys, amqtransport, pyarrow, pydantic_core; print(amqtransport.__file__); print(sys.executable)"
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if shutil.which(interpreter, path=env.get("PATH")) is None and LAUNCHER_ENV_VAR not in env:
        # not on this machine's PATH (e.g. a venv that is not activated): check with the
        # base interpreter of this one, which has the same minor version
        env[LAUNCHER_ENV_VAR] = getattr(sys, "_base_executable", sys.executable)
    with tempfile.TemporaryDirectory() as cwd:
        done = _run([str(env_dir / "bin" / "python"), "-c", probe], "checking the packed env", cwd=cwd, env=env)
    lines = done.stdout.strip().splitlines()
    if len(lines) != 2 or not Path(lines[0]).resolve().is_relative_to(env_dir.resolve()):
        raise PackEnvError(f"the packed env's python imported amqtransport from outside the env: {done.stdout!r}")
    return lines[1]


def _archive(env_dir: Path, archive: Path) -> None:
    tmp = archive.with_name(archive.name + ".part")
    with tarfile.open(tmp, "w:gz", compresslevel=6) as tar:
        for entry in sorted(env_dir.iterdir()):
            tar.add(entry, arcname=entry.name)
    os.replace(tmp, archive)


def submit_line(archive: Path, *, master: str = "spark://HOST:7077", app: str = "/path/to/your_job.py") -> str:
    """The client-mode spark-submit line for a packed env (run from the archive's directory)."""
    env_name = archive.name.removesuffix(".tar.gz")
    return (
        f"cd {archive.parent} && PYSPARK_PYTHON=./{env_name}/bin/python spark-submit --master {master} "
        f"--deploy-mode client --archives {archive.name}#{env_name} {app}"
    )


def pack_env(
    out_dir: str | Path,
    *,
    wheel: str | Path | None = None,
    with_packages: Sequence[str] = (),
    interpreter: str | None = None,
    name: str = "env",
    force: bool = False,
    python: str = sys.executable,
    say: Callable[[str], None] = print,
) -> PackedEnv:
    """Build ``out_dir/<name>/`` and ``out_dir/<name>.tar.gz`` (see the module docstring)."""
    out = Path(out_dir).resolve()
    env_dir, archive = out / name, out / f"{name}.tar.gz"
    interpreter = interpreter or f"python{sys.version_info.major}.{sys.version_info.minor}"
    if env_dir.exists() or archive.exists():
        if not force:
            raise PackEnvError(f"{env_dir} or {archive} already exists; remove it or pass --force")
        shutil.rmtree(env_dir, ignore_errors=True)
        archive.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    if wheel is None:
        source = source_checkout()
        if source is None:
            raise PackEnvError(
                "this amqtransport is not a source checkout, so pack-env cannot build its wheel: pass "
                "--wheel PATH (build one with `make wheel` or `pip wheel --no-deps -w dist .` in a checkout)"
            )
        say(f"building the wheel from {source} ...")
        wheel_path = build_wheel(source, out / "wheels", python)
    else:
        wheel_path = Path(wheel).resolve()
        if not wheel_path.is_file() or wheel_path.suffix != ".whl":
            raise PackEnvError(f"--wheel {wheel}: not a .whl file")
    say(f"wheel: {wheel_path.name}")
    say(f"installing {wheel_path.name}[spark-executor] {' '.join(with_packages)} into {env_dir}/site-packages ...")
    _run([python, "-m", "pip", "install", "--quiet", "--no-compile", "--disable-pip-version-check",
          "--target", str(env_dir / "site-packages"), f"{wheel_path}[spark-executor]", *with_packages],
         "pip install --target")
    if (env_dir / "site-packages" / "pyspark").exists():
        say("warning: pyspark is in the env (pulled in by --with?); Spark ships its own, it only adds size")
    launcher = env_dir / "bin" / "python"
    launcher.parent.mkdir(parents=True, exist_ok=True)
    launcher.write_text(launcher_text(interpreter), encoding="utf-8")
    launcher.chmod(0o755)
    (env_dir / "bin" / "python3").symlink_to("python")  # relative: survives the move
    checked_with = _check(env_dir, interpreter)
    say(f"checked: {env_dir}/bin/python imports amqtransport from the env (with {checked_with})")
    say(f"packing {archive} ...")
    _archive(env_dir, archive)
    return PackedEnv(env_dir, archive, wheel_path, interpreter, _tree_bytes(env_dir), archive.stat().st_size, checked_with)
