"""The output store: each attempt's whole output (up to ORCHESTRATOR_TASK_OUTPUT_MAX_BYTES) in
files, head and tail kept around a marker saying how much was cut; the database keeps its own
head and tail; the task page links to the file; a store that cannot be written never costs a
task its outcome."""
from __future__ import annotations

import html
import os
import re
import resource
import stat

import pytest
from django.db import connection
from django.urls import reverse

from orchestrator.foundation.outputstore import FileStore, cut_marker
from tests.api.personas import alice, alice_client, anonymous_client, fast_password_hasher  # noqa: F401
from tests.conftest import wait_until
from tests.worker.conftest import settle, trigger

SEQ = "".join(f"{i}\n" for i in range(1, 20001)).encode()  # what `seq 1 20000` prints


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# --- the file store on its own ---------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 7, 300, 1000, 5000, 70000])
def test_the_store_keeps_the_head_a_marker_and_the_tail_whatever_the_chunks(tmp_path, chunk):
    store = FileStore(tmp_path / "out", 4000)  # per stream: the first 1000 and the last 1000 bytes
    writer = store.open_writer((12, 3))
    for start in range(0, len(SEQ), chunk):
        writer.write("stdout", SEQ[start : start + chunk])
    writer.write("stderr", b"short")
    writer.close()
    cut = len(SEQ) - 2000
    assert store.read((12, 3), "stdout", 0, 10**6) == SEQ[:1000] + cut_marker(cut, 1000, 1000) + SEQ[-1000:]
    assert cut_marker(cut, 1000, 1000) == f"\n[orchestrator: {cut} bytes cut here; the first 1000 and the last 1000 bytes of this stream are kept]\n".encode()
    assert store.read((12, 3), "stderr", 0, 100) == b"short"
    assert store.read((12, 3), "stdout", 1000, 14) == b"\n[orchestrator"


@pytest.mark.parametrize("size", [0, 1999, 2000, 2001])
def test_output_within_the_cap_is_kept_whole_and_past_it_is_cut(tmp_path, size):
    store = FileStore(tmp_path, 4000)
    writer = store.open_writer((1, 1))
    writer.write("stdout", SEQ[:size])
    writer.close()
    kept = store.read((1, 1), "stdout", 0, 10**6)
    if size == 0:
        assert kept is None  # nothing written: no file
    elif size <= 2000:
        assert kept == SEQ[:size]
    else:
        assert kept == SEQ[:1000] + cut_marker(size - 2000, 1000, 1000) + SEQ[size - 1000 : size]


def test_names_come_from_ids_and_the_files_are_private(tmp_path):
    root = tmp_path / "not" / "there" / "yet"
    store = FileStore(root, 1000)
    writer = store.open_writer((123456, 7))
    assert store.size((123456, 7), "stdout") is None  # not readable before the attempt ends
    writer.write("stdout", b"x")
    writer.close()
    path = store.path((123456, 7), "stdout")
    assert path == root / "123" / "123456-7.stdout"
    assert (_mode(root), _mode(path.parent), _mode(path)) == (0o2770, 0o2770, 0o640)
    with pytest.raises(ValueError, match="stream must be one of"):
        store.path((1, 1), "../../etc/passwd")
    store.delete([(123456, 7), (99, 1)])
    assert not path.exists()
    assert not path.parent.exists()


def test_a_writer_whose_directory_the_retention_emptied_makes_it_again(tmp_path):
    store = FileStore(tmp_path, 1000)
    writer = store.open_writer((5, 1))
    store.delete([(4, 1)])  # the same directory, empty: removed
    assert not store.path((5, 1), "stdout").parent.exists()
    writer.write("stdout", b"still here")
    writer.close()
    assert store.read((5, 1), "stdout", 0, 100) == b"still here"
    assert _mode(store.path((5, 1), "stdout").parent) == 0o2770


# --- through a real worker -------------------------------------------------------------------

def _page(ti) -> str:
    return reverse("web:task_detail", args=[ti.dag_run.dag.dag_id, ti.dag_run.run_id, ti.task_id])


def _full_output_link(client, ti, stream: str) -> str:
    page = client.get(_page(ti))
    assert page.status_code == 200
    links = re.findall(r'class="full-output" href="([^"]+)"', page.content.decode())
    return next(html.unescape(link) for link in links if f"/{stream}.log" in link)


def _body(response) -> bytes:
    return b"".join(response.streaming_content)


@pytest.mark.django_db(transaction=True)
@pytest.mark.integration
def test_a_task_printing_past_the_cap_keeps_head_marker_and_tail_and_the_page_serves_it(
    worker, make_dag, tmp_path, settings, alice_client, anonymous_client  # noqa: F811
):
    root = tmp_path / "missing" / "output"  # created by the worker
    settings.ORCHESTRATOR_TASK_OUTPUT_DIR = str(root)
    dag = make_dag([{"task_id": "t", "bash_command": "seq 1 20000; echo oops >&2"}])
    worker(ORCHESTRATOR_TASK_OUTPUT_DIR=root, ORCHESTRATOR_TASK_OUTPUT_MAX_BYTES=4000, ORCHESTRATOR_LOG_HEAD_BYTES=300, ORCHESTRATOR_LOG_TAIL_BYTES=300)
    ti = settle(trigger(dag), "t", ("success",), timeout=40)
    attempt = ti.attempts.get()
    store = FileStore(root, 4000)
    key = (ti.pk, attempt.attempt_token)
    expected = SEQ[:1000] + cut_marker(len(SEQ) - 2000, 1000, 1000) + SEQ[-1000:]
    assert store.read(key, "stdout", 0, 10**6) == expected
    assert store.read(key, "stderr", 0, 100) == b"oops\n"
    assert (_mode(root), _mode(store.path(key, "stdout"))) == (0o2770, 0o640)
    # The database keeps its own (smaller) head and tail, as before.
    assert attempt.output_truncated
    assert attempt.stdout.endswith(SEQ[-300:].decode())
    assert attempt.stdout.startswith(SEQ[:300].decode())
    assert attempt.result == "20000"

    assert "The full output has it" in alice_client.get(_page(ti)).content.decode()
    url = _full_output_link(alice_client, ti, "stdout")
    response = alice_client.get(url)
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Content-Disposition"].startswith("inline")
    assert _body(response) == expected
    assert anonymous_client.get(url).status_code == 302  # to the login page
    # Another attempt number, another stream name: no such output.
    assert alice_client.get(url.replace(f"/attempts/{attempt.attempt_token}/", "/attempts/999/")).status_code == 404
    assert alice_client.get(url.replace("/stdout.log", "/secret.log")).status_code == 404

    # Removed from the store (retention, or kept on another machine): the page says so.
    store.delete([key])
    assert alice_client.get(url).status_code == 404
    page = alice_client.get(_page(ti)).content.decode()
    assert "the output store does not have the full output" in page


@pytest.mark.django_db(transaction=True)
@pytest.mark.integration
def test_the_store_keeps_raw_bytes_and_the_database_sanitised_text(worker, make_dag, tmp_path, settings, alice_client):  # noqa: F811
    settings.ORCHESTRATOR_TASK_OUTPUT_DIR = str(tmp_path)
    dag = make_dag([{"task_id": "t", "bash_command": r"printf 'a\000b\377c\n'; printf '<script>x</script>\n' >&2"}])
    worker(ORCHESTRATOR_TASK_OUTPUT_DIR=tmp_path)
    ti = settle(trigger(dag), "t", ("success",), timeout=40)
    attempt = ti.attempts.get()
    store = FileStore(tmp_path, 1 << 20)
    assert store.read((ti.pk, attempt.attempt_token), "stdout", 0, 100) == b"a\x00b\xffc\n"
    assert attempt.stdout == "a\ufffdb\ufffdc\n"
    response = alice_client.get(_full_output_link(alice_client, ti, "stderr"))
    assert (response["Content-Type"], _body(response)) == ("text/plain; charset=utf-8", b"<script>x</script>\n")


@pytest.mark.django_db(transaction=True)
@pytest.mark.integration
def test_a_store_that_cannot_be_written_costs_the_task_nothing(worker, make_dag, tmp_path, settings, alice_client):  # noqa: F811
    """The store's directory cannot be made (its parent is a file): the task succeeds, the
    database keeps its text, the worker's log says why, and the page says the store lacks it."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    root = blocker / "output"
    settings.ORCHESTRATOR_TASK_OUTPUT_DIR = str(root)
    dag = make_dag([{"task_id": "t", "bash_command": "seq 1 20000"}])
    proc = worker(ORCHESTRATOR_TASK_OUTPUT_DIR=root, ORCHESTRATOR_LOG_HEAD_BYTES=300, ORCHESTRATOR_LOG_TAIL_BYTES=300)
    ti = settle(trigger(dag), "t", ("success",), timeout=40)
    attempt = ti.attempts.get()
    assert attempt.result == "20000"
    assert attempt.stdout.endswith("19999\n20000\n")
    wait_until(lambda: any("could not open its output in the output store" in line for line in proc.log_lines), timeout=10, message="the warning")
    page = alice_client.get(_page(ti)).content.decode()
    assert "the output store does not have the full output" in page


@pytest.mark.django_db(transaction=True)
@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_a_read_only_store_costs_the_task_nothing(worker, make_dag, tmp_path):
    root = tmp_path / "output"
    root.mkdir(mode=0o500)
    dag = make_dag([{"task_id": "t", "bash_command": "echo hello"}])
    proc = worker(ORCHESTRATOR_TASK_OUTPUT_DIR=root)
    ti = settle(trigger(dag), "t", ("success",), timeout=40)
    assert ti.attempts.get().stdout == "hello\n"
    wait_until(lambda: any("output store" in line for line in proc.log_lines), timeout=10, message="the warning")


@pytest.mark.django_db(transaction=True)
@pytest.mark.integration
def test_a_store_that_fails_mid_write_costs_the_task_nothing(worker, make_dag, tmp_path, settings, alice_client):  # noqa: F811
    """The worker may not write files past 1500 bytes (a full disk, as far as it can tell): the
    store's writes fail halfway through the task; the task succeeds with its text in the
    database, the worker says why, and no partial file is left to be served."""
    if connection.vendor == "sqlite":
        pytest.skip("the worker writes the SQLite database too: the file size limit would cut that short")
    settings.ORCHESTRATOR_TASK_OUTPUT_DIR = str(tmp_path)
    dag = make_dag([{"task_id": "t", "bash_command": "seq 1 20000"}])
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1500, hard))  # inherited by the worker only
    try:
        proc = worker(ORCHESTRATOR_TASK_OUTPUT_DIR=tmp_path, ORCHESTRATOR_TASK_OUTPUT_MAX_BYTES=8000)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    ti = settle(trigger(dag), "t", ("success",), timeout=40)
    attempt = ti.attempts.get()
    assert attempt.result == "20000"
    assert attempt.stdout.endswith("19999\n20000\n")
    wait_until(lambda: any("could not write its output in the output store" in line for line in proc.log_lines), timeout=10, message="the warning")
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == []
    page = alice_client.get(_page(ti)).content.decode()
    assert "the output store does not have the full output" in page
