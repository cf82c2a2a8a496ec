"""``amq spark ...``: helpers for running the ``amq`` data source on a Spark cluster.

``amq spark pack-env`` builds the slim env to ship to executors whose Python lacks the
library (``--archives``) and prints the exact ``spark-submit`` line; the how and why
are in :mod:`amqtransport.spark.pack`.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from amqtransport.spark.pack import LAUNCHER_ENV_VAR, PackEnvError, pack_env

__all__ = ["spark", "pack_env_cmd"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def spark() -> None:
    """Run the amq data source on a Spark cluster (standalone, YARN, Spark Connect)."""


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


@spark.command("pack-env")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("amq-spark-env"),
              show_default=True, help="Directory for env/ (unpacked) and env.tar.gz.")
@click.option("--wheel", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="The amqtransport wheel to pack (default: build it from this source checkout).")
@click.option("--with", "with_packages", multiple=True, metavar="REQ",
              help="Another requirement your job needs on the executors (repeatable).")
@click.option("--interpreter", default=None, metavar="NAME",
              help="The Python the launcher runs on each node (default: python3.X of this build, found on PATH; "
                   f"${LAUNCHER_ENV_VAR} overrides it at run time).")
@click.option("--name", default="env", show_default=True, help="Name of the env directory and archive (NAME.tar.gz#NAME).")
@click.option("--master", default="spark://HOST:7077", show_default=True, help="Master to show in the printed line.")
@click.option("--app", default="/path/to/your_job.py", show_default=True,
              help="Job file to show in the printed line (give an absolute path: the line cds to --out).")
@click.option("--force", is_flag=True, help="Replace an existing env and archive.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
def pack_env_cmd(out_dir: Path, wheel: Path | None, with_packages: tuple[str, ...], interpreter: str | None,
                 name: str, master: str, app: str, force: bool, as_json: bool) -> None:
    """Build a slim env (the wheel + pyarrow, no pyspark) to ship with --archives.

    The env's bin/python is a launcher that runs the node's own python3.X with the
    packed libraries, so it does not depend on the build machine's interpreter path;
    every node needs a Python of the same minor version on PATH (the compiled wheels,
    pyarrow and pydantic-core, are built for it).
    """
    say = (lambda _text: None) if as_json else (lambda text: click.echo(text, err=True))
    try:
        packed = pack_env(out_dir, wheel=wheel, with_packages=with_packages, interpreter=interpreter, name=name,
                          force=force, say=say)
    except PackEnvError as exc:
        raise click.ClickException(str(exc)) from None
    line = packed.submit_line(master=master, app=app)
    if as_json:
        click.echo(json.dumps({
            "env": str(packed.env_dir), "archive": str(packed.archive), "wheel": str(packed.wheel),
            "interpreter": packed.interpreter, "env_bytes": packed.env_bytes, "archive_bytes": packed.archive_bytes,
            "checked_with": packed.checked_with, "submit": line,
        }))
        return
    click.echo(f"env     : {packed.env_dir} ({_mb(packed.env_bytes)}; bin/python runs the node's {packed.interpreter})")
    click.echo(f"archive : {packed.archive} ({_mb(packed.archive_bytes)})")
    click.echo("submit (client mode; run it from there: the driver's own Python workers use ./"
               f"{name}/bin/python too):")
    click.echo(f"  {line}")
