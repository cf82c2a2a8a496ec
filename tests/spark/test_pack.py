"""``amq spark pack-env`` pieces that need no cluster and no pip run (the whole command runs
in tests/spark/test_cluster.py, where its line ships the producer to a cluster)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from amqtransport.cli.spark_cmd import spark
from amqtransport.spark.pack import LAUNCHER_ENV_VAR, launcher_text, source_checkout, submit_line


def make_env(root: Path, interpreter: str) -> Path:
    env = root / "env"
    (env / "site-packages" / "packed_probe").mkdir(parents=True)
    (env / "site-packages" / "packed_probe" / "__init__.py").write_text("WHERE = __file__\n")
    launcher = env / "bin" / "python"
    launcher.parent.mkdir()
    launcher.write_text(launcher_text(interpreter))
    launcher.chmod(0o755)
    return env


def test_launcher_runs_the_named_interpreter_with_the_packed_libraries_wherever_the_env_moves(tmp_path: Path) -> None:
    env = make_env(tmp_path / "built", sys.executable)
    moved = tmp_path / "elsewhere" / "env"
    moved.parent.mkdir()
    shutil.move(str(env), str(moved))  # as an archive unpacked on another node
    probe = "import sys, packed_probe; print(packed_probe.WHERE); print(sys.executable)"
    done = subprocess.run(["./env/bin/python", "-c", probe], cwd=moved.parent, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": "/nonexistent"})
    assert done.returncode == 0, done.stderr
    where, exe = done.stdout.splitlines()
    assert Path(where).resolve().is_relative_to(moved.resolve())
    assert Path(exe).resolve() == Path(sys.executable).resolve()


def test_launcher_interpreter_is_overridden_by_the_env_var_and_missing_one_fails_clearly(tmp_path: Path) -> None:
    env = make_env(tmp_path, "python-that-does-not-exist")
    missing = subprocess.run([str(env / "bin" / "python"), "-c", "pass"], capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin"})
    assert missing.returncode != 0 and "python-that-does-not-exist" in missing.stderr
    ok = subprocess.run([str(env / "bin" / "python"), "-c", "import packed_probe"], capture_output=True, text=True,
                        env={"PATH": "/usr/bin:/bin", LAUNCHER_ENV_VAR: sys.executable})
    assert ok.returncode == 0, ok.stderr


def test_launcher_names_no_path_of_the_build_machine() -> None:
    text = launcher_text("python3.11")
    assert sys.prefix not in text and sys.base_prefix not in text and "exec \"${AMQ_ENV_PYTHON:-python3.11}\"" in text


def test_submit_line_runs_from_the_archive_directory_in_client_mode(tmp_path: Path) -> None:
    line = submit_line(tmp_path / "env.tar.gz", master="spark://m:7077", app="/jobs/j.py")
    assert line == (f"cd {tmp_path} && PYSPARK_PYTHON=./env/bin/python spark-submit --master spark://m:7077 "
                    "--deploy-mode client --archives env.tar.gz#env /jobs/j.py")


def test_pack_env_refuses_an_existing_env_and_a_wheel_that_is_not_one(tmp_path: Path) -> None:
    (tmp_path / "out" / "env").mkdir(parents=True)
    runner = CliRunner()
    res = runner.invoke(spark, ["pack-env", "--out", str(tmp_path / "out")])
    assert res.exit_code != 0 and "already exists; remove it or pass --force" in res.output
    not_a_wheel = tmp_path / "x.zip"
    not_a_wheel.write_text("")
    res = runner.invoke(spark, ["pack-env", "--out", str(tmp_path / "new"), "--wheel", str(not_a_wheel)])
    assert res.exit_code != 0 and "not a .whl file" in res.output


def test_source_checkout_is_found_from_the_editable_install() -> None:
    root = source_checkout()
    assert root is not None and (root / "amqtransport" / "spark" / "pack.py").exists()
