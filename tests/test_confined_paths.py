"""Reads and writes under a dataset (or a solution folder, a folder of `.fidef` files) stay
inside it: a symbolic link that leads out, a loop of links, a FIFO where a file should be, are
refused in one line that names them (Note [confined paths] in fibgen/fsutil.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from _bench_dataset import make_dataset
from fibgen.cli import main
from fibgen.format import FormatError
from fibgen.format.dataset import append_lines_atomic, inside_dataset, pack_solution
from fibgen.fsutil import PathRefused, confined, regular_file

ESCAPE = "{} is a symbolic link to {}, outside the dataset {}; fibgen reads and writes only inside the dataset"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FIBGEN_CACHE_DIR", str(tmp_path / "cache"))


def _fibgen(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _bench(capsys, root: Path) -> tuple[int, str, str]:
    return _fibgen(capsys, "bench", str(root), "--devices", "cpu", "--quiet", "--repeat", "3")


# ---------------------------------------------------------------------------------------
# The guard


def test_the_guard_follows_links_inside_and_names_the_one_that_leads_out(tmp_path):
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "in").symlink_to("a")
    (root / "out").symlink_to(tmp_path)
    (root / "l1").symlink_to("l2")
    (root / "l2").symlink_to("l1")
    assert confined(root, root / "in" / "x", "the dataset") == root / "in" / "x"
    with pytest.raises(PathRefused) as caught:
        confined(root, root / "out" / "x", "the dataset")
    assert str(caught.value) == f"{root}/out/x: " + ESCAPE.format(root / "out", tmp_path, root)
    with pytest.raises(PathRefused, match=r"l1/x: .*/l1 is a symbolic link in a loop of links"):
        confined(root, root / "l1" / "x", "the dataset")
    with pytest.raises(PathRefused, match="leads out of the dataset .* through '..'"):
        confined(root, root / ".." / "x", "the dataset")
    os.mkfifo(root / "a" / "pipe")
    with pytest.raises(PathRefused, match="pipe: a FIFO, not a regular file"):
        regular_file(root / "a" / "pipe")
    with pytest.raises(FormatError, match="a FIFO, not a regular file"):
        inside_dataset(root, root / "in" / "pipe", file=True)


# ---------------------------------------------------------------------------------------
# bench


def test_bench_does_not_write_traces_through_a_linked_traces_folder(tmp_path, capsys):
    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3,))
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (root / "traces").symlink_to(outside)
    code, out, err = _bench(capsys, root)
    assert code == 1
    assert err == (
        f"error: {root}/traces/scale/scale_h64.jsonl: "
        + ESCAPE.format(root / "traces", outside, root)
        + "\n"
    )
    assert list(outside.iterdir()) == []


def test_bench_does_not_copy_the_file_a_linked_trace_file_points_at(tmp_path, capsys):
    root = make_dataset(tmp_path / "ds", ["good_returns"], sizes=(3,))
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"not": "a trace"}\n')
    link = root / "traces" / "scale" / "scale_h64.jsonl"
    link.parent.mkdir(parents=True)
    link.symlink_to(secret)
    code, _, err = _bench(capsys, root)
    assert code == 1
    assert err == f"error: {link}: " + ESCAPE.format("it", secret, root) + "\n"
    assert link.is_symlink() and secret.read_text() == '{"not": "a trace"}\n'


def test_an_appender_refuses_a_linked_file_before_reading_it(tmp_path):
    root, secret = tmp_path / "ds", tmp_path / "secret"
    secret.write_text("private\n")
    link = root / "traces" / "t.jsonl"
    link.parent.mkdir(parents=True)
    link.symlink_to(secret)
    with pytest.raises(FormatError, match="it is a symbolic link to"):
        append_lines_atomic(link, ["{}"], root=root)
    assert link.is_symlink() and secret.read_text() == "private\n"


# ---------------------------------------------------------------------------------------
# pack, and bench, which packs a folder whose files changed


def _folder_with_link(tmp_path: Path, target: Path) -> tuple[Path, Path]:
    root = make_dataset(tmp_path / "ds", [], sizes=(3,))
    code = main(
        [
            "scaffold-solution",
            "rmsnorm_h4096",
            "--language",
            "python",
            "--author",
            "me",
            "-o",
            str(root / "solutions"),
        ]
    )
    assert code == 0
    (folder,) = (root / "solutions").glob("me/*/*/*")
    (folder / "key.pem").symlink_to(target)
    return root, folder


@pytest.mark.slow
def test_pack_refuses_a_file_that_links_out_of_the_dataset(tmp_path, capsys):
    secret = tmp_path / "id_rsa"
    secret.write_text("-----BEGIN PRIVATE KEY-----\n")
    root, folder = _folder_with_link(tmp_path, secret)
    capsys.readouterr()
    before = (folder / f"{folder.name}.json").read_text()
    code, out, err = _fibgen(capsys, "pack", str(folder))
    assert code == 1 and out == ""
    assert err == f"error: {folder}/key.pem: " + ESCAPE.format("it", secret, root) + "\n"
    assert (folder / f"{folder.name}.json").read_text() == before
    assert "PRIVATE KEY" not in before


@pytest.mark.slow
def test_pack_follows_a_link_that_stays_inside_the_dataset(tmp_path):
    root, folder = _folder_with_link(tmp_path, Path("../../../../src/helper.py"))
    (root / "solutions" / "src").mkdir()
    (root / "solutions" / "src" / "helper.py").write_text("HELP = 1\n")
    packed = pack_solution(folder)
    assert {s.path: s.content for s in packed.solution.sources}["key.pem"] == "HELP = 1\n"


@pytest.mark.slow
def test_a_standalone_solution_folder_is_its_own_root(tmp_path, capsys):
    secret = tmp_path / "id_rsa"
    secret.write_text("private\n")
    assert (
        main(
            [
                "scaffold-solution",
                "rmsnorm_h4096",
                "--language",
                "python",
                "--author",
                "me",
                "-o",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    (folder,) = (tmp_path / "out").glob("me/*/*/*")
    # Moved out of any solutions/ folder: the folder alone is what it may link into.
    alone = tmp_path / "standalone" / folder.name
    alone.parent.mkdir()
    folder.rename(alone)
    capsys.readouterr()
    (alone / "key.pem").symlink_to(secret)
    with pytest.raises(FormatError) as caught:
        pack_solution(alone)
    assert "outside the solution folder" in str(caught.value)


@pytest.mark.slow
def test_bench_refuses_a_solution_folder_with_a_link_out(tmp_path, capsys):
    secret = tmp_path / "id_rsa"
    secret.write_text("private\n")
    root, folder = _folder_with_link(tmp_path, secret)
    capsys.readouterr()
    code, _, err = _bench(capsys, root)
    assert code == 1
    assert err == f"error: {folder}/key.pem: " + ESCAPE.format("it", secret, root) + "\n"
    assert not (root / "traces").exists()


# ---------------------------------------------------------------------------------------
# workloads


def test_workloads_are_not_written_through_a_linked_blob_folder(tmp_path, capsys):
    root, outside = tmp_path / "ds", tmp_path / "elsewhere"
    root.mkdir()
    outside.mkdir()
    (root / "blob").symlink_to(outside)
    # kv_indptr and kv_indices are generated and stored: a blob is written per workload.
    code, out, err = _fibgen(
        capsys,
        "workloads",
        "gqa_paged_decode_h32_kv8_d128_ps1",
        "--axes",
        "batch_size=2",
        "--axes",
        "num_pages=16",
        "-o",
        str(root),
    )
    assert code == 1 and out == ""
    assert err.startswith(f"error: {root}/blob/workloads/")
    assert ESCAPE.format(root / "blob", outside, root) in err
    assert list(outside.iterdir()) == []
    assert not (root / "workloads").exists()


# ---------------------------------------------------------------------------------------
# fibgen check


def test_check_names_links_out_loops_and_fifos_and_does_not_hang(tmp_path):
    folder, other = tmp_path / "defs", tmp_path / "other"
    folder.mkdir()
    other.mkdir()
    (other / "o.fidef").write_text("family x {}\n")
    (folder / "link.fidef").symlink_to(other / "o.fidef")
    (folder / "loop1.fidef").symlink_to("loop2.fidef")
    (folder / "loop2.fidef").symlink_to("loop1.fidef")
    os.mkfifo(folder / "x.fidef")
    (folder / "dangling.fidef").symlink_to("gone.fidef")
    done = subprocess.run(
        [sys.executable, "-m", "fibgen.cli", "check", "defs"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        # The checkout under test, whatever fibgen the environment installed.
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        "error: cannot read defs/dangling.fidef: it is a symbolic link to gone.fidef, which "
        "does not exist",
        "",
        f"error: cannot read defs/link.fidef: it is a symbolic link to {other}/o.fidef, outside "
        "the folder defs; fibgen reads and writes only inside the folder",
        "",
        "error: cannot read defs/loop1.fidef: it is a symbolic link in a loop of links "
        "(-> loop2.fidef)",
        "",
        "error: cannot read defs/loop2.fidef: it is a symbolic link in a loop of links "
        "(-> loop1.fidef)",
        "",
        "error: cannot read defs/x.fidef: a FIFO, not a regular file",
        "",
        "5 errors emitted",
    ]
