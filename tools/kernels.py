"""Running chapters in Jupyter kernels: one way to start a kernel, one way to execute a chapter.

Every tool that executes chapters (refresh, seeds_and_mutants, benchmark, execute) calls `execute()`
here, and the test suite's nbval uses the same kernel manager (see the repository's conftest.py).

**Kernels start over IPC, not TCP.** jupyter_client picks a kernel's five TCP ports by binding
port 0 and closing the socket again; the kernel binds them a moment later. Two kernels started
side by side (pytest-xdist, two chapters at a time) can pick the same port in that gap, and a
client then talks to the wrong kernel: both sit idle for good, each waiting on the other
(jupyter_client's issue 487). Unix-domain sockets named after the kernel's own connection file
cannot collide, need no port, and carry no "running over TCP without encryption" warning.

**Every execution has a timeout** (a cell, and the kernel's start), so a hang becomes an error
that names the chapter and the cell.

**nbclient's client waits in slices of a second.** Its asynchronous channels wait for a message
with one `socket.poll(timeout)`; zmq.asyncio wakes that poll from the socket's edge-triggered
file descriptor, and now and then the wake-up is lost: the message sits in the socket while the
poll sleeps out its whole timeout and finds it only then. A cell that took 5 s once returned
after exactly the 300 s cell timeout, and a wait without a timeout (nbclient's output poll)
never returns. `SlicedPollChannel` polls a second at a time until the timeout, so a lost
wake-up costs at most a second.

**Kernels are stopped, not asked to quit.** After the last cell every output has arrived, and a
graceful shutdown would only wait for the interpreter to tear torch down (about 2 s a chapter,
in every tool that executes chapters); `execute()` stops the kernel at once.

**The machine a chapter's outputs come from.** `machine()` names what decides a chapter's
floating-point arithmetic: the processor, torch's vector kernels (AVX2, AVX-512, NEON or the
plain ones that ATEN_CPU_CAPABILITY=default forces), the torch and numpy builds. The refresh tool
stores it in each chapter's metadata; nbval compares every output where it matches and only the
CPU-independent ones elsewhere (conftest.py).
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.manager import AsyncKernelManager, KernelManager
from traitlets import Type, Unicode, default

CELL_TIMEOUT_S = 300
STARTUP_TIMEOUT_S = 120
POLL_SLICE_S = 1.0
METADATA_KEY = "papernotes"


def _socket_stem() -> str:
    # An absolute path of its own for each kernel (jupyter_client's default, "kernel-ipc", is
    # relative: the kernel runs in the chapter's folder and its client elsewhere). Short, because
    # a Unix socket's path has at most 104-108 characters.
    return os.path.join(tempfile.gettempdir(), f"pn-kernel-{uuid.uuid4().hex[:12]}")


class IpcKernelManager(KernelManager):
    """A kernel manager whose kernels listen on Unix-domain sockets (see the module docstring);
    nbval's kernels use it."""

    transport = Unicode("ipc", config=True)

    @default("ip")
    def _ip_default(self) -> str:
        return _socket_stem()


class SlicedPollChannel(AsyncZMQSocketChannel):
    """An asynchronous channel whose `get_msg` polls a second at a time (see the module
    docstring): the same messages, the same timeout, and no wait on a lost wake-up."""

    async def get_msg(self, timeout: float | None = None) -> dict:
        from queue import Empty

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = POLL_SLICE_S if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return await super().get_msg(timeout=min(POLL_SLICE_S, left))
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise


class SlicedPollClient(AsyncKernelClient):
    """nbclient's kernel client, with the shell and output channels polled in slices."""

    shell_channel_class = Type(SlicedPollChannel)
    iopub_channel_class = Type(SlicedPollChannel)


class AsyncIpcKernelManager(AsyncKernelManager):
    """The same for nbclient, which drives its kernels asynchronously, with its clients
    polling in slices."""

    transport = Unicode("ipc", config=True)

    @default("ip")
    def _ip_default(self) -> str:
        return _socket_stem()

    @default("client_factory")
    def _client_factory_default(self) -> type:
        return SlicedPollClient


def machine() -> str:
    """What decides a chapter's floating-point results here, as one line."""
    import numpy
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    return (
        f"{platform.system()} {platform.machine()} {_processor()}; "
        f"torch {torch.__version__} ({capability}); numpy {numpy.__version__}"
    )


def _processor() -> str:
    """The CPU's model and a short hash of its feature flags (two EPYCs may differ in them)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown CPU"
    fields = dict(
        line.split(":", 1) for line in info.splitlines() if ":" in line and line[0] != "\t"
    )
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    model = fields.get("model name") or fields.get("CPU part") or platform.processor() or "CPU"
    flags = fields.get("flags") or fields.get("Features") or ""
    digest = hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:8]
    return f"{model} [flags {digest}]"


def outputs_machine(nb) -> str | None:
    """The machine a chapter's committed outputs were computed on (None if never recorded)."""
    return nb.metadata.get(METADATA_KEY, {}).get("outputs_from")


def kernel_environment(
    *,
    seed: int | None = None,
    record_dir: Path | str | None = None,
    extra: dict[str, str] | None = None,
) -> dict:
    """The environment a chapter's kernel runs in: ours, quiet, with the seed, the records dir
    and any `extra` variables (ATEN_CPU_CAPABILITY, say)."""
    environment = {**os.environ, "PAPERNOTES_QUIET": "1", **(extra or {})}
    environment.pop("JPY_PARENT_PID", None)
    if seed is not None:
        environment["PAPERNOTES_SEED"] = str(seed)
    if record_dir is not None:
        environment["PAPERNOTES_RECORD_DIR"] = str(record_dir)
    return environment


class ChapterFailed(RuntimeError):
    """A chapter stopped: a cell raised or timed out. Names the chapter and the cell."""

    def __init__(self, chapter: str, cell: int | None, ename: str, evalue: str):
        where = f"cell {cell}" if cell is not None else "its kernel"
        super().__init__(f"{chapter}: {where} failed: {ename}: {evalue}")
        self.chapter, self.cell, self.ename, self.evalue = chapter, cell, ename, evalue

    def __reduce__(self):
        # Raised in a worker process, it must unpickle in the parent (the default would call
        # __init__ with the message alone and break the process pool).
        return (type(self), (self.chapter, self.cell, self.ename, self.evalue))


def execute(
    nb,
    path: Path,
    *,
    seed: int | None = None,
    record_dir: Path | str | None = None,
    timeout: int = CELL_TIMEOUT_S,
    environment: dict[str, str] | None = None,
    allow_errors: bool = False,
    total_timeout: float | None = None,
) -> float:
    """Execute the notebook `nb` (read from `path`) top to bottom in a fresh kernel, in the
    chapter's folder; its outputs are written into `nb`. Returns the seconds it took.

    Raises ChapterFailed naming the chapter and the code cell when a cell raises, a cell runs
    over `timeout` seconds, the whole execution over `total_timeout` seconds (when given), or the
    kernel does not start within STARTUP_TIMEOUT_S. `environment` adds variables to the kernel's
    environment. With `allow_errors`, a cell that raises is recorded in its outputs and the
    chapter goes on (a timeout still raises).
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    client = NotebookClient(
        nb,
        timeout=timeout,
        startup_timeout=STARTUP_TIMEOUT_S,
        kernel_name="python3",
        kernel_manager_class=AsyncIpcKernelManager,
        allow_errors=allow_errors,
        resources={"metadata": {"path": str(path.parent)}},
        # Every output is in by the time the last cell returns, so the kernel is stopped at once:
        # a graceful shutdown waits for the interpreter to tear torch down, about 2 s a chapter
        # that no reader sees (records are written by the claim check, never at exit).
        shutdown_kernel="immediate",
    )
    start = time.perf_counter()
    if total_timeout is not None:
        # Each cell may take what is left of the whole execution's time, at most `timeout`.
        client.timeout_func = lambda _cell: max(
            1, min(timeout, int(total_timeout - (time.perf_counter() - start)))
        )
    try:
        # The kernel's own stderr (shutdown chatter) is not the chapter's: errors come back as
        # messages, and a kernel that dies raises DeadKernelError.
        client.execute(
            env=kernel_environment(seed=seed, record_dir=record_dir, extra=environment),
            stderr=subprocess.DEVNULL,
        )
    except CellExecutionError as failure:
        raise ChapterFailed(path.stem, _running_cell(nb), failure.ename, failure.evalue) from None
    except (CellTimeoutError, DeadKernelError, RuntimeError, TimeoutError) as failure:
        name = type(failure).__name__
        raise ChapterFailed(path.stem, _running_cell(nb), name, str(failure)[:500]) from None
    return time.perf_counter() - start


def _running_cell(nb) -> int | None:
    """The index (among code cells) of the last code cell that started executing."""
    started = [
        i
        for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code")
        if cell.get("execution_count") is not None
    ]
    return started[-1] if started else None


DEFAULT_JOBS = 2


def jobs(default: int = DEFAULT_JOBS) -> int:
    """How many chapters execute at once: $JOBS (the Makefile's `JOBS=N`), else two, one
    single-threaded kernel per core. Every tool that executes chapters reads it here."""
    text = os.environ.get("JOBS", "").strip()
    if not text:
        return default
    if not text.isdigit() or int(text) < 1:
        raise SystemExit(f"JOBS must be a whole number of at least 1; got {text!r}")
    return int(text)


def in_parallel(work, paths: list[Path], workers: int | None = None):
    """Run `work(path)` for each chapter, `workers` at a time ($JOBS by default, one
    single-threaded kernel per core); yields (path, result, failure) as each ends, failure a
    ChapterFailed or None."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    workers = jobs() if workers is None else workers
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(work, path): path for path in paths}
        for future in as_completed(futures):
            try:
                yield futures[future], future.result(), None
            except ChapterFailed as failure:
                yield futures[future], None, failure


def progress(done: int, total: int, started: float, what: str) -> None:
    """One line of progress for long commands: chapters done of total, and the time so far."""
    elapsed = time.perf_counter() - started
    print(f"[{done}/{total}, {elapsed:.0f} s] {what}", file=sys.stderr, flush=True)
