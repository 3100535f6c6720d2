"""bench/gpu/kit_fit.sh: the GPU kit's folders laid out again to fit one device call beside the tree."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024


def _write(path: Path, size: int, mark: bytes) -> bytes:
    """A file of ``size`` bytes: ``mark`` at its start and end, zeros between (sparse, so quick)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.write(mark)
        f.seek(size - len(mark))
        f.write(mark)
    return path.read_bytes()


def test_folders_fit_and_every_wheel_comes_back_whole(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".git" / "info" / "exclude").write_text("/.gpu/\n")
    (repo / "results.bin").write_bytes(os.urandom(20 * MIB))  # a tree of 20 MiB on disk: folders of at most 42
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    gpu = repo / ".gpu"
    (gpu / "tools").mkdir(parents=True)
    (gpu / "tools" / "install.sh").write_text("# prepare.sh's\n")
    # prepare.sh's layout: vLLM's wheel in 52 MiB parts, the other wheels after them
    vllm = _write(gpu / "c0" / "vllm.whl.part00", 52 * MIB, b"v-one") + _write(
        gpu / "c1" / "vllm.whl.part01", 30 * MIB, b"v-two")
    small = {f"w{i}.whl": _write(gpu / "c1" / f"w{i}.whl", (4 + i) * MIB, f"w{i}".encode()) for i in range(4)}
    big = _write(gpu / "c2" / "big.whl.part00", 40 * MIB, b"b-one") + _write(
        gpu / "c3" / "big.whl.part01", 5 * MIB, b"b-two")
    out = subprocess.run(["bash", str(ROOT / "bench/gpu/kit_fit.sh")], cwd=repo, capture_output=True, text=True,
                         env={**os.environ, "LC_ALL": "C"})
    assert out.returncode == 0, out.stderr
    folders = sorted(p for p in gpu.iterdir() if p.name.startswith("c"))
    assert [p.name for p in folders] == [f"c{i}" for i in range(len(folders))]
    assert len(out.stdout.splitlines()) == len(folders)
    for folder in folders:  # each beside the 20 MiB tree (and the 2 MiB margin) within 64 MiB
        assert sum(f.stat().st_size for f in folder.iterdir()) <= 42 * MIB, folder
    files = {f.name: f for folder in folders for f in folder.iterdir()}
    assert not [p for p in gpu.iterdir() if p.name.startswith(".fit")]
    assert (gpu / "tools" / "install.sh").exists()

    def joined(stem: str) -> bytes:
        return b"".join(files[n].read_bytes() for n in sorted(files) if n.startswith(stem + ".part"))

    assert joined("vllm.whl") == vllm  # install.sh: cat vllm.whl.part* (and NAME.whl.part* for others)
    assert joined("big.whl") == big
    assert {n: files[n].read_bytes() for n in small} == small


def test_a_tree_that_leaves_no_room_is_refused(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "results.bin").write_bytes(os.urandom(60 * MIB))
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    (repo / ".gpu" / "tools").mkdir(parents=True)
    (repo / ".git" / "info" / "exclude").write_text("/.gpu/\n")
    _write(repo / ".gpu" / "c0" / "vllm.whl.part00", MIB, b"v")
    out = subprocess.run(["bash", str(ROOT / "bench/gpu/kit_fit.sh")], cwd=repo, capture_output=True, text=True)
    assert out.returncode == 2 and "leaves too little room" in out.stderr
    assert (repo / ".gpu" / "c0" / "vllm.whl.part00").exists()  # nothing moved
