"""Power loss: a FUSE passthrough that keeps unsynced writes in memory and loses them on command.

Theory of operation
-------------------
Modelled on Jepsen's LazyFS. ``python -m chaos.nemesis.lazyfs BACKING MOUNT`` mounts
``MOUNT`` (fusepy over libfuse2, ``direct_io``, no attribute or entry cache: the kernel
keeps no page of ours, so what a reader sees is what this process answers) as a view
of the directory ``BACKING``:

* **Data** written to a file goes to an in-memory :class:`Overlay` of that file (keyed
  by the backing file's inode, so a rename carries it along), not to ``BACKING``. Reads
  and sizes merge the overlay over the backing file. ``fsync``/``fdatasync`` of a file
  writes its overlay to the backing file in write order and forgets it: *durable*.
* **Metadata** (create, mkdir, rename, unlink, truncate, chmod) goes to ``BACKING`` at
  once: durable as soon as it returns (a simplification: a journaling filesystem
  orders metadata, LazyFS does the same by default). Truncating clips the overlay.
* **Power loss** (the ``drop`` command): every overlay is forgotten -- what was written
  and not fsynced is gone. ``drop tear`` first writes a prefix (a random length, from the
  seeded ``--seed``) of the newest unsynced write to the backing file: a torn write.
* **Full disk**: a write is refused with ENOSPC when the backing filesystem could not
  take it plus every unsynced byte (so ``disk-full`` works on a node whose data is here).

Control: one command per line on stdin, one answer per line on stdout. ``freeze``
takes the lock every operation takes and keeps it (every filesystem call waits),
``drop [tear] [TID...]`` loses the unsynced data, fails every later request of those
threads (the killed node's: a request it had in flight when the power went, held by
the freeze, must not land after the loss) and lets go of the lock, ``thaw`` lets go
without losing anything, ``stats`` counts. The nemesis freezes, SIGKILLs the node
(without waiting: a process blocked in a request the frozen filesystem holds cannot
die until it is answered), then drops: no write of the dead node and no read of the
other node (shared store) lands between the kill and the loss. The kernel names a
request's caller by its thread id, hence the list of the node's threads. ``mounted`` is printed once the mount is up.
:class:`LazyFs` is the parent's handle (start, command, stop by pid, unmount).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Overlay", "PowerLoss", "LazyFs", "unavailable_reason", "main"]


@dataclass
class PowerLoss:
    files: int = 0
    bytes: int = 0
    torn: tuple[int, int, int] | None = None  # (inode, offset, bytes of the torn write kept)

    def describe(self) -> str:
        torn = f"; torn write: {self.torn[2]} bytes kept at offset {self.torn[1]}" if self.torn else ""
        return f"lost {self.bytes} unsynced bytes in {self.files} file(s){torn}"


@dataclass
class _Dirty:
    writes: list[tuple[int, int, bytes]] = field(default_factory=list)  # (seq, offset, data), in order

    @property
    def end(self) -> int:
        return max((off + len(d) for _, off, d in self.writes), default=0)


class Overlay:
    """The unsynced writes of every file (pure: no I/O; the FUSE layer reads and
    writes the backing files around it)."""

    def __init__(self) -> None:
        self.files: dict[int, _Dirty] = {}
        self.seq = 0

    @property
    def pending(self) -> int:
        return sum(len(d) for f in self.files.values() for _, _, d in f.writes)

    def write(self, ino: int, offset: int, data: bytes) -> None:
        if offset < 0:
            raise ValueError(f"negative offset {offset}")
        self.seq += 1
        self.files.setdefault(ino, _Dirty()).writes.append((self.seq, offset, bytes(data)))

    def size(self, ino: int, base_size: int) -> int:
        f = self.files.get(ino)
        return base_size if f is None else max(base_size, f.end)

    def read(self, ino: int, offset: int, size: int, base: bytes, base_size: int) -> bytes:
        """``size`` bytes at ``offset`` of the file whose backing bytes there are ``base``."""
        total = self.size(ino, base_size)
        n = max(0, min(size, total - offset))
        buf = bytearray(base[:n].ljust(n, b"\0"))
        f = self.files.get(ino)
        if f is not None:
            for _, off, data in f.writes:
                lo, hi = max(off, offset), min(off + len(data), offset + n)
                if lo < hi:
                    buf[lo - offset:hi - offset] = data[lo - off:hi - off]
        return bytes(buf)

    def truncate(self, ino: int, length: int) -> None:
        f = self.files.get(ino)
        if f is None:
            return
        f.writes = [(s, off, d[:max(0, length - off)]) for s, off, d in f.writes if off < length]
        if not f.writes:
            del self.files[ino]

    def take(self, ino: int) -> list[tuple[int, bytes]]:
        """The writes to make durable, in order, forgotten here (fsync)."""
        f = self.files.pop(ino, None)
        return [] if f is None else [(off, d) for _, off, d in f.writes]

    def forget(self, ino: int) -> None:
        self.files.pop(ino, None)

    def power_loss(self, tear: random.Random | None = None) -> tuple[PowerLoss, tuple[int, int, bytes] | None]:
        """Forget everything; with ``tear``, (inode, offset, prefix) of the newest write
        that reaches the disk torn (a prefix shorter than the write)."""
        loss = PowerLoss(files=len(self.files), bytes=self.pending)
        torn: tuple[int, int, bytes] | None = None
        if tear is not None:
            newest = max(((s, ino, off, d) for ino, f in self.files.items() for s, off, d in f.writes),
                         default=None)
            if newest is not None and len(newest[3]) > 1:
                _, ino, off, d = newest
                keep = tear.randrange(1, len(d))
                torn = (ino, off, d[:keep])
                loss.torn = (ino, off, keep)
        self.files.clear()
        return loss, torn


# -- the filesystem (runs in the child process) ------------------------------------------


def _fuse_module() -> Any:
    import fuse  # fusepy: ctypes over libfuse.so.2

    return fuse


def _operations_base() -> type:
    try:
        return _fuse_module().Operations  # type: ignore[no-any-return]
    except (ImportError, OSError):
        return object


class LazyOps(_operations_base()):  # type: ignore[misc]
    def __init__(self, backing: str, seed: int) -> None:
        self.root = os.path.realpath(backing)
        self.overlay = Overlay()
        self.mutex = threading.RLock()
        self.rng = random.Random(seed)
        self.fh_ino: dict[int, int] = {}
        self.dead: set[int] = set()  # thread ids of the processes that lost their power

    def _p(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def _guard(self, fn: Callable[[], Any]) -> Any:
        fuse = _fuse_module()
        with self.mutex:
            if self.dead and fuse.fuse_get_context()[2] in self.dead:
                raise fuse.FuseOSError(errno.EIO)  # a request of a process that lost its power
            try:
                return fn()
            except OSError as exc:
                raise fuse.FuseOSError(exc.errno or errno.EIO) from exc

    # attributes and directories
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        def do() -> dict[str, Any]:
            st = os.lstat(self._p(path))
            out = {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime",
                                                "st_mtime", "st_ctime", "st_ino")}
            out["st_size"] = self.overlay.size(st.st_ino, st.st_size)
            return out
        return self._guard(do)  # type: ignore[no-any-return]

    def readdir(self, path: str, fh: int) -> list[str]:
        return self._guard(lambda: [".", "..", *os.listdir(self._p(path))])  # type: ignore[no-any-return]

    def access(self, path: str, amode: int) -> None:
        if not os.access(self._p(path), amode):
            raise _fuse_module().FuseOSError(errno.EACCES)

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self._p(path))
        return {k: getattr(st, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree",
                                            "f_files", "f_flag", "f_frsize", "f_namemax")}

    def mkdir(self, path: str, mode: int) -> None:
        self._guard(lambda: os.mkdir(self._p(path), mode))

    def rmdir(self, path: str) -> None:
        self._guard(lambda: os.rmdir(self._p(path)))

    def chmod(self, path: str, mode: int) -> None:
        self._guard(lambda: os.chmod(self._p(path), mode))

    def chown(self, path: str, uid: int, gid: int) -> None:
        self._guard(lambda: os.chown(self._p(path), uid, gid))

    def utimens(self, path: str, times: tuple[float, float] | None = None) -> None:
        self._guard(lambda: os.utime(self._p(path), times))

    def rename(self, old: str, new: str) -> None:
        def do() -> None:
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(self._p(new))
                if st.st_nlink <= 1:
                    self.overlay.forget(st.st_ino)  # the file it replaces is gone
            os.rename(self._p(old), self._p(new))
        self._guard(do)

    def unlink(self, path: str) -> None:
        def do() -> None:
            st = os.lstat(self._p(path))
            os.unlink(self._p(path))
            if st.st_nlink <= 1:
                self.overlay.forget(st.st_ino)
        self._guard(do)

    def readlink(self, path: str) -> str:
        return self._guard(lambda: os.readlink(self._p(path)))  # type: ignore[no-any-return]

    def symlink(self, target: str, source: str) -> None:
        self._guard(lambda: os.symlink(source, self._p(target)))

    # files
    def _opened(self, fd: int) -> int:
        self.fh_ino[fd] = os.fstat(fd).st_ino
        return fd

    def open(self, path: str, flags: int) -> int:
        # read-write whatever the caller asked (an fsync through a read-only descriptor
        # writes the file's pending data too); no O_APPEND: writes come with their offset
        flags &= ~(os.O_APPEND | os.O_TRUNC | os.O_CREAT | os.O_EXCL | os.O_ACCMODE)
        return self._guard(lambda: self._opened(os.open(self._p(path), flags | os.O_RDWR)))  # type: ignore[no-any-return]

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        return self._guard(lambda: self._opened(os.open(self._p(path), os.O_RDWR | os.O_CREAT | os.O_TRUNC, mode)))  # type: ignore[no-any-return]

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        def do() -> bytes:
            st = os.fstat(fh)
            return self.overlay.read(st.st_ino, offset, size, os.pread(fh, size, offset), st.st_size)
        return self._guard(do)  # type: ignore[no-any-return]

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        def do() -> int:
            st = os.statvfs(self.root)
            if st.f_bavail * st.f_frsize < self.overlay.pending + len(data):
                raise OSError(errno.ENOSPC, "no space left on the backing filesystem")
            self.overlay.write(self.fh_ino.get(fh) or os.fstat(fh).st_ino, offset, data)
            return len(data)
        return self._guard(do)  # type: ignore[no-any-return]

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        def do() -> None:
            p = self._p(path)
            ino = os.lstat(p).st_ino
            os.truncate(p, length)
            self.overlay.truncate(ino, length)
        self._guard(do)

    def _sync(self, fh: int) -> None:
        ino = self.fh_ino.get(fh) or os.fstat(fh).st_ino
        for off, data in self.overlay.take(ino):
            os.pwrite(fh, data, off)

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        self._guard(lambda: self._sync(fh))

    def flush(self, path: str, fh: int) -> None:
        return None

    def release(self, path: str, fh: int) -> None:
        def do() -> None:
            self.fh_ino.pop(fh, None)
            os.close(fh)
        self._guard(do)

    def fsyncdir(self, path: str, datasync: int, fh: int) -> None:
        return None

    # control
    def power_loss(self, tear: bool) -> PowerLoss:
        loss, torn = self.overlay.power_loss(self.rng if tear else None)
        if torn is not None:
            ino, off, data = torn
            path = _find_ino(self.root, ino)
            if path is not None:
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.pwrite(fd, data, off)
                finally:
                    os.close(fd)
        return loss


def _find_ino(root: str, ino: int) -> str | None:
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            with contextlib.suppress(OSError):
                if os.lstat(p).st_ino == ino:
                    return p
    return None


def _control(ops: LazyOps) -> None:
    frozen = False
    for line in sys.stdin:
        cmd = line.split()
        try:
            if cmd[:1] == ["freeze"]:
                if not frozen:
                    ops.mutex.acquire()
                    frozen = True
                print("frozen", flush=True)
            elif cmd[:1] == ["drop"]:
                with ops.mutex:
                    ops.dead.update(int(x) for x in cmd[1:] if x.isdigit())
                    loss = ops.power_loss(tear="tear" in cmd[1:])
                if frozen:
                    ops.mutex.release()
                    frozen = False
                print(f"dropped {loss.describe()}", flush=True)
            elif cmd[:1] == ["thaw"]:
                if frozen:
                    ops.mutex.release()
                    frozen = False
                print("thawed", flush=True)
            elif cmd[:1] == ["stats"]:
                with ops.mutex:
                    print(f"stats pending {ops.overlay.pending} files {len(ops.overlay.files)}", flush=True)
            else:
                print(f"error unknown command {line.strip()!r}", flush=True)
        except Exception as exc:  # the answer names it; the filesystem goes on
            print(f"error {exc!r}", flush=True)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m chaos.nemesis.lazyfs", description=__doc__.splitlines()[0])
    ap.add_argument("backing")
    ap.add_argument("mount")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    fuse = _fuse_module()
    ops = LazyOps(a.backing, a.seed)
    threading.Thread(target=_control, args=(ops,), daemon=True, name="lazyfs-control").start()

    def announce() -> None:
        deadline = time.monotonic() + 30
        while not os.path.ismount(a.mount) and time.monotonic() < deadline:
            time.sleep(0.01)
        print("mounted" if os.path.ismount(a.mount) else "error not mounted after 30 s", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    fuse.FUSE(ops, a.mount, foreground=True, nothreads=False, direct_io=True, attr_timeout=0, entry_timeout=0,
              negative_timeout=0, fsname="amq-lazyfs")
    return 0


# -- the parent's handle -----------------------------------------------------------------


def unavailable_reason() -> str | None:
    """None when a LazyFS mount can work here; else why not."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if os.geteuid() != 0:
        return "mounting FUSE here needs root"
    try:
        _fuse_module()
    except ImportError:
        return "fusepy is not installed (the chaos extra: pip install fusepy)"
    except OSError as exc:
        return f"libfuse2 cannot be loaded ({exc}; scripts/setup.sh installs libfuse2)"
    return None


class LazyFs:
    """One LazyFS process: ``BACKING`` seen at ``MOUNT`` (see the module docstring)."""

    def __init__(self, backing: Path, mount: Path, *, seed: int = 1, log: Path | None = None) -> None:
        self.backing = backing
        self.mount = mount
        self.seed = seed
        self.log = log
        self.proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def start(self, timeout: float = 30.0) -> LazyFs:
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mount.mkdir(parents=True, exist_ok=True)
        if self.log is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
        stderr: Any = open(self.log, "a", encoding="utf-8") if self.log else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "chaos.nemesis.lazyfs", str(self.backing), str(self.mount),
                 "--seed", str(self.seed)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, bufsize=1)
        finally:
            if stderr is not subprocess.DEVNULL:
                stderr.close()
        try:
            answer = self._read(timeout)
            if answer != "mounted":
                raise OSError(f"LazyFS at {self.mount} did not mount: {answer or 'the process exited'}")
        except BaseException:
            self.stop()
            raise
        return self

    def _read(self, timeout: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.append(self.proc.stdout.readline().strip()  # type: ignore[union-attr]
                                                             if self.proc else ""), daemon=True)
        reader.start()
        reader.join(timeout)
        if reader.is_alive():
            raise TimeoutError(f"LazyFS at {self.mount}: no answer within {timeout} s")
        return out[0] if out else ""

    def command(self, cmd: str, timeout: float = 30.0) -> str:
        """Send one control command; its answer line (raises on ``error``)."""
        with self._lock:
            if self.proc is None or self.proc.poll() is not None or self.proc.stdin is None:
                raise OSError(f"LazyFS at {self.mount} is not running")
            self.proc.stdin.write(cmd + "\n")
            self.proc.stdin.flush()
            answer = self._read(timeout)
        if not answer or answer.startswith("error"):
            raise OSError(f"LazyFS at {self.mount}: {cmd!r} -> {answer or 'the process exited'}")
        return answer

    def power_loss(self, pid: int | None, tear: bool = False) -> str:
        """Freeze the filesystem, SIGKILL process ``pid`` (not waiting: it may be stuck in
        a request the frozen filesystem holds), drop the unsynced data, and fail every
        request of that process's threads from now on (those it had in flight
        included: they come after the power went). The caller reaps ``pid``."""
        self.command("freeze")
        tids: list[str] = []
        try:
            if pid is not None:
                tids = [t.name for t in Path(f"/proc/{pid}/task").iterdir()] if Path(f"/proc/{pid}").exists() else []
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        except BaseException:
            self.command("thaw")
            raise
        return self.command(" ".join(["drop", *(["tear"] if tear else []), str(pid or ""), *tids]).strip()
                            ).removeprefix("dropped ")

    def stop(self) -> None:
        """Unmount (lazily if still busy) and stop the process by pid; idempotent."""
        if os.path.ismount(self.mount):
            done = subprocess.run(["umount", str(self.mount)], capture_output=True, check=False, timeout=30)
            if done.returncode != 0:
                subprocess.run(["umount", "-l", str(self.mount)], capture_output=True, check=False, timeout=30)
        if self.proc is not None:
            if self.proc.stdin is not None:
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc = None


if __name__ == "__main__":
    sys.exit(main())
