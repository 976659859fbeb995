"""Kernels start side by side without a hang, and a chapter that fails says which and where."""

import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import kernels
import nbformat
import pytest

PARALLEL_STARTS = 20


def start_run_stop(_: int) -> str:
    """Start a kernel the way nbval does (tools/kernels.py's manager), run a cell, stop it."""
    manager = kernels.IpcKernelManager(kernel_name="python3")
    manager.start_kernel(stderr=sys.stderr)
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=kernels.STARTUP_TIMEOUT_S)
        reply = client.execute_interactive("6 * 7", timeout=60, store_history=False)
        return reply["content"]["status"] + f" {manager.transport}"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


@pytest.mark.slow
def test_twenty_kernels_started_at_once_all_answer():
    # Twenty at once on two cores: far more contention than pytest-xdist or the book's two
    # executors ever make. A port race would leave a client waiting on a kernel that never hears
    # it; the timeouts above turn that into a failure instead of a hang.
    with ProcessPoolExecutor(max_workers=PARALLEL_STARTS) as pool:
        replies = list(pool.map(start_run_stop, range(PARALLEL_STARTS), timeout=600))
    assert replies == ["ok ipc"] * PARALLEL_STARTS


def test_a_failing_chapter_names_itself_and_its_cell(tmp_path):
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("# a chapter"),
            nbformat.v4.new_code_cell("import os\nprint(os.environ['PAPERNOTES_SEED'])"),
            nbformat.v4.new_code_cell("1 / 0"),
        ]
    )
    with pytest.raises(kernels.ChapterFailed, match=r"demo: cell 1 failed: ZeroDivisionError"):
        kernels.execute(nb, tmp_path / "demo.ipynb", seed=3)
    assert nb.cells[1].outputs[0]["text"] == "3\n"  # the seed reached the kernel


def test_a_cell_that_hangs_times_out_naming_the_chapter(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import time; time.sleep(60)")])
    with pytest.raises(kernels.ChapterFailed, match=r"slow: cell 0 failed: CellTimeoutError"):
        kernels.execute(nb, Path(tmp_path) / "slow.ipynb", timeout=2)


def test_the_machine_names_torchs_kernels(monkeypatch):
    import torch

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    assert "(DEFAULT)" in kernels.machine()
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert "(AVX512)" in kernels.machine()


def test_a_chapter_failure_crosses_processes_intact():
    import pickle

    failure = kernels.ChapterFailed("demo", 3, "ClaimsFailed", "1 claim(s) do not hold")
    copy = pickle.loads(pickle.dumps(failure))
    assert (copy.chapter, copy.cell, copy.ename, str(copy)) == (
        "demo",
        3,
        "ClaimsFailed",
        str(failure),
    )


def run_cells(path):
    nb = nbformat.read(path, as_version=4)
    return kernels.execute(nb, path)


def test_chapters_run_side_by_side_and_a_failure_comes_back_named(tmp_path):
    good, bad = tmp_path / "good.ipynb", tmp_path / "bad.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")]), good)
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 / 0")]), bad)
    outcomes = {p.stem: (r, f) for p, r, f in kernels.in_parallel(run_cells, [good, bad])}
    assert outcomes["good"][0] > 0 and outcomes["good"][1] is None
    assert outcomes["bad"][0] is None and outcomes["bad"][1].chapter == "bad"


class LostWakeUpSocket:
    """A socket whose message is already there but whose poll sleeps out its whole timeout
    before it sees it, as zmq.asyncio's poll does when it loses the descriptor's wake-up."""

    def __init__(self):
        self.polls = []

    async def poll(self, timeout_ms=None):
        import asyncio

        self.polls.append(timeout_ms)
        if timeout_ms is None:
            await asyncio.Event().wait()  # never woken
        await asyncio.sleep(timeout_ms / 1000)
        return 1


def lost_wake_up_channel(channel_class):
    channel = object.__new__(channel_class)
    channel.socket = LostWakeUpSocket()

    async def receive(**_):
        return {"msg_type": "execute_reply"}

    channel._recv = receive
    return channel


def test_a_lost_wake_up_costs_a_second_not_the_whole_timeout():
    import asyncio
    import time

    channel = lost_wake_up_channel(kernels.SlicedPollChannel)
    start = time.monotonic()
    message = asyncio.run(asyncio.wait_for(channel.get_msg(timeout=30), 10))
    assert message == {"msg_type": "execute_reply"}
    assert time.monotonic() - start < 3 * kernels.POLL_SLICE_S
    # and a wait without a timeout (nbclient's output poll) returns too, instead of never
    channel = lost_wake_up_channel(kernels.SlicedPollChannel)
    assert asyncio.run(asyncio.wait_for(channel.get_msg(timeout=None), 10))


def test_a_sliced_poll_still_times_out():
    import asyncio
    from queue import Empty

    channel = lost_wake_up_channel(kernels.SlicedPollChannel)

    async def never_ready(timeout_ms=None):
        await asyncio.sleep((timeout_ms or 0) / 1000)
        return 0

    channel.socket.poll = never_ready
    with pytest.raises(Empty):
        asyncio.run(asyncio.wait_for(channel.get_msg(timeout=1.5), 10))


def test_nbclients_kernels_get_the_sliced_client():
    client = kernels.AsyncIpcKernelManager(kernel_name="python3").client()
    assert isinstance(client, kernels.SlicedPollClient)
    assert client.shell_channel_class is kernels.SlicedPollChannel
    assert client.iopub_channel_class is kernels.SlicedPollChannel


def test_a_stopped_kernel_leaves_every_output_and_file_of_its_last_cell(tmp_path):
    # execute() stops the kernel without a graceful shutdown: what the last cell printed and
    # wrote must be complete, and the kernel's process gone, when execute returns.
    record = tmp_path / "record.txt"
    pid_file = tmp_path / "pid.txt"
    last = (
        "import os\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        f"with open({str(record)!r}, 'w') as f:\n"
        "    f.write('x' * 100_000)\n"
        "print('done' * 1000)"
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(last)])
    kernels.execute(nb, tmp_path / "last.ipynb")
    assert nb.cells[0].outputs[0]["text"] == "done" * 1000 + "\n"
    assert record.read_text() == "x" * 100_000
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # no such process: stopped and reaped
