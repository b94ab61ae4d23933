"""``poslens models clean``: what the tests' set-up leaves in the cache can be removed in one command."""

from __future__ import annotations


def _fill(root):
    for rel, size in (("models/a.gguf", 300), ("gguf/abc/model.safetensors", 1000), ("native/k.so", 10),
                      ("other/keep.txt", 5)):
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"x" * size)


def test_clean_removes_the_cache_folders_only(cli, tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("POSLENS_CACHE", str(root))
    _fill(root)
    code, out, err = cli("models", "clean")
    assert code == 0, err
    assert sorted(p.name for p in root.iterdir()) == ["other"] and (root / "other" / "keep.txt").is_file()
    assert str(root / "gguf") in out and "1.31 kB" in out.splitlines()[-1], out
    code, out, err = cli("models", "clean")
    assert code == 0 and str(root) in out, err


def test_clean_can_keep_the_fetched_models(cli, tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("POSLENS_CACHE", str(root))
    _fill(root)
    code, out, err = cli("models", "clean", "--keep-models", "--quiet")
    assert code == 0 and out == "", (out, err)
    assert sorted(p.name for p in root.iterdir()) == ["models", "other"]
