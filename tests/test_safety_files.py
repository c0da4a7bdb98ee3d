"""No data loss and no reading outside a checkpoint: writers never touch their source, shard and symlink paths
stay inside the checkpoint (Hugging Face cache snapshots still load), `--force` and failed writes leave nothing
behind, a full disk ends in one line."""

import hashlib
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import cli_fails, model_dir
from safetensors.numpy import load_file, save_file

import jaxbert
from jaxbert import files as jfiles
from jaxbert.cli import main

torch = pytest.importorskip("torch")


@pytest.fixture
def src(tmp_path):
    """A transformers BertModel directory with MiniLM's tokenizer, inside tmp_path/work."""
    directory = tmp_path / "work" / "src"
    model_dir(directory)
    return directory


def _digest(directory):
    """Every file below `directory` with its content hash: equal before and after means nothing was touched."""
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            out[os.path.relpath(path, directory)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return out


def _leftovers(directory):
    return [p for p in os.listdir(directory) if ".partial" in p]


@pytest.mark.parametrize("command", ["convert", "export"])
@pytest.mark.parametrize("where", ["itself", "ancestor", "inside", "symlink"])
def test_a_writer_never_replaces_or_writes_into_its_source(src, tmp_path, capsys, command, where):
    if command == "export":
        assert main(["convert", str(src), str(tmp_path / "jax")]) == 0
        (tmp_path / "work" / "jax").mkdir()
        os.rename(tmp_path / "jax", tmp_path / "work" / "jax" / "src")
        src = tmp_path / "work" / "jax" / "src"
    (tmp_path / "work" / "beside.txt").write_text("keep me")
    before = _digest(tmp_path / "work")
    dst = {"itself": src, "ancestor": src.parent, "inside": src / "out", "symlink": tmp_path / "link"}[where]
    if where == "symlink":
        os.symlink(src, dst)
    rc = main([command, str(src), str(dst), "--force"])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert {
        "itself": "is the source",
        "ancestor": "contains the source",
        "inside": "lies inside the source",
        "symlink": "is the source",
    }[where] in err
    assert _digest(tmp_path / "work") == before
    assert not _leftovers(src.parent) and not _leftovers(tmp_path)


def _shard(src, layout):
    """Split src's model.safetensors into shards placed as `layout` says: {shard name: key prefix list}."""
    state = load_file(src / "model.safetensors")
    (src / "model.safetensors").unlink()
    weight_map = {}
    for name, keys in layout.items():
        save_file({k: state[k] for k in keys}, os.path.join(src, name), metadata={"format": "pt"})
        weight_map.update({k: name for k in keys})
    with open(src / "model.safetensors.index.json", "w") as f:
        f.write(__import__("json").dumps({"metadata": {}, "weight_map": weight_map}))
    return sorted(state)


def test_shards_must_stay_inside_the_checkpoint_and_hold_each_key_once(src, tmp_path, capsys):
    keys = sorted(load_file(src / "model.safetensors"))
    half = len(keys) // 2
    _shard(src, {"a.safetensors": keys[:half], "b.safetensors": keys[half:]})
    assert main(["info", str(src)]) == 0  # a regular sharded checkpoint loads
    capsys.readouterr()
    outside = tmp_path / "outside.safetensors"
    os.rename(src / "b.safetensors", outside)
    index = (src / "model.safetensors.index.json").read_text()
    (src / "model.safetensors.index.json").write_text(index.replace('"b.safetensors"', '"../../outside.safetensors"'))
    cli_fails(capsys, tmp_path, "convert", src, match="outside.safetensors: names a file outside the checkpoint")
    (src / "model.safetensors.index.json").write_text(index.replace('"b.safetensors"', f'"{outside}"'))
    cli_fails(capsys, tmp_path, "convert", src, match="is not a relative path inside the checkpoint")
    os.symlink(outside, src / "b.safetensors")
    (src / "model.safetensors.index.json").write_text(index)
    cli_fails(capsys, tmp_path, "convert", src, match=f"b.safetensors: resolves to {outside}, outside the checkpoint")
    os.unlink(src / "b.safetensors")
    state = load_file(outside)
    state[keys[0]] = load_file(src / "a.safetensors")[keys[0]]  # the first key again, in the second shard
    save_file(state, src / "b.safetensors", metadata={"format": "pt"})
    cli_fails(capsys, tmp_path, "convert", src, match=f"key {keys[0]!r} is also in shard a.safetensors")


def _hub_cache(src, root):
    """src laid out as a Hugging Face cache entry: blobs by hash, a snapshot of relative symlinks into them."""
    entry = root / "models--org--tiny"
    (entry / "blobs").mkdir(parents=True)
    snapshot = entry / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    for name in os.listdir(src):
        data = open(src / name, "rb").read()
        blob = hashlib.sha256(data).hexdigest()
        (entry / "blobs" / blob).write_bytes(data)
        os.symlink(os.path.join("..", "..", "blobs", blob), snapshot / name)
    return snapshot


def test_hugging_face_cache_snapshots_load_but_links_out_of_the_entry_are_refused(src, tmp_path, capsys):
    snapshot = _hub_cache(src, tmp_path / "hub")
    assert main(["convert", str(snapshot), str(tmp_path / "jax")]) == 0, capsys.readouterr().err
    capsys.readouterr()
    copied = tmp_path / "jax" / "vocab.txt"
    assert not os.path.islink(copied) and copied.read_bytes() == (src / "vocab.txt").read_bytes()
    bert = jaxbert.load(snapshot)
    assert bert.embed(["a snapshot loads"]).shape == (1, 32)
    secret = tmp_path / "secret.txt"
    secret.write_text("not a vocabulary")
    for name in ("vocab.txt", "config.json", "model.safetensors"):
        target = snapshot / name
        saved = os.readlink(target)
        os.unlink(target)
        os.symlink(secret, target)
        match = f"{name}: resolves to {secret}, outside the checkpoint directory"
        cli_fails(capsys, tmp_path, "convert", snapshot, match=match)
        os.unlink(target)
        os.symlink(saved, target)
    os.unlink(src / "tokenizer.json")
    os.symlink(os.path.join("..", "..", "secret.txt"), src / "tokenizer.json")  # a plain directory: `..` escapes
    cli_fails(capsys, tmp_path, "convert", src, match="tokenizer.json: resolves to")


@pytest.mark.parametrize("command", ["convert", "export"])
def test_a_writer_never_replaces_the_blobs_a_cache_snapshot_reads(src, tmp_path, capsys, command):
    """The snapshot's files are links into its entry's blobs/: `convert SNAPSHOT ENTRY/blobs --force` replaced
    blobs/ by the conversion, and the snapshot (every id resolving to it) lost every file."""
    snapshot = _hub_cache(src, tmp_path / "hub")
    before = _digest(tmp_path / "hub")
    for dst in (snapshot.parent.parent / "blobs", snapshot.parent.parent / "converted"):
        assert main([command, str(snapshot), str(dst), "--force"]) == 1
        err = capsys.readouterr().err.strip()
        assert "the cache entry whose blobs" in err and len(err.splitlines()) == 1, err
    assert _digest(tmp_path / "hub") == before and jaxbert.load(snapshot).embed(["still there"]).shape == (1, 32)


@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_force_onto_a_file_or_symlink_replaces_it_and_leaves_nothing_behind(src, tmp_path, capsys, kind):
    dst = tmp_path / "dst"
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("the link's target survives")
    if kind == "file":
        dst.write_text("a file")
    else:
        os.symlink(other, dst)
    assert main(["convert", str(src), str(dst), "--force"]) == 0, capsys.readouterr().err
    assert dst.is_dir() and not dst.is_symlink() and (dst / "flax_model.msgpack").is_file()
    assert (other / "keep.txt").read_text() == "the link's target survives"
    assert not _leftovers(tmp_path)


def test_embed_into_a_directory_fails_before_any_work_and_leaves_nothing(src, tmp_path, capsys):
    (tmp_path / "texts.txt").write_text("one\ntwo\n")
    (tmp_path / "out.npy").mkdir()
    cli_fails(
        capsys,
        tmp_path,
        "embed",
        src,
        "--input",
        tmp_path / "texts.txt",
        "--output",
        tmp_path / "out.npy",
        match="out.npy: is a directory",
    )
    assert not _leftovers(tmp_path)


@pytest.mark.parametrize("command", ["predict", "evaluate", "evaluate-link"])
def test_predict_and_evaluate_never_write_over_a_file_they_read(tmp_path, capsys, command):
    """predict --output its own --input replaced the rows with predictions; evaluate --output MODEL/config.json
    replaced the model's config with metrics (the model then no longer loaded). A symlinked directory on the way
    changes nothing."""
    model = model_dir(tmp_path / "model", "BertForSequenceClassification")
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "a b", "label": "LABEL_1"}\n{"text": "c d", "label": "LABEL_0"}\n')
    (tmp_path / "alias").symlink_to(model)
    before, _ = _digest(tmp_path), capsys.readouterr()
    output = {
        "predict": rows,
        "evaluate": tmp_path / "model" / "config.json",
        "evaluate-link": tmp_path / "alias" / "tokenizer.json",
    }[command]
    args = ["--input", rows] if command == "predict" else ["--task", "sequence-classification", "--file", rows]
    match = "which this command reads"
    cli_fails(capsys, tmp_path, command.split("-")[0], model, *args, "--output", output, match=match)
    assert _digest(tmp_path) == before and not _leftovers(tmp_path) and not _leftovers(model)


def _limited(limit_bytes, *args):
    """The CLI in a subprocess whose files may not grow beyond `limit_bytes`: writes fail as on a full disk
    (SIGXFSZ ignored, so a write fails with EFBIG instead of killing the process)."""
    code = (
        "import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit_bytes}, {limit_bytes})); "
        "from jaxbert.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    # Without the suite's compilation cache (conftest.py): the limit would fail JAX's own cache writes too, and
    # those are JAX's warnings, not the CLI's error under test.
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    args = [sys.executable, "-c", code, *map(str, args)]
    return subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize("command", ["export", "convert", "embed"])
def test_a_full_disk_ends_in_one_line_and_leaves_nothing(src, tmp_path, command):
    if command == "export":
        assert main(["convert", str(src), str(tmp_path / "jax")]) == 0
    (tmp_path / "texts.txt").write_text("\n".join(f"text number {i}" for i in range(300)))
    args = {
        "export": ("export", tmp_path / "jax", tmp_path / "dst"),
        "convert": ("convert", src, tmp_path / "dst"),
        "embed": ("embed", src, "--input", tmp_path / "texts.txt", "--output", tmp_path / "dst.npy"),
    }[command]
    proc = _limited(20_000, *args)  # room for config.json, not for the weights or 300 embeddings
    assert proc.returncode == 1, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
    written = tmp_path / ("dst.npy" if command == "embed" else "dst")
    assert f"error: {written}: writing" in proc.stderr and "failed" in proc.stderr, proc.stderr
    assert not (tmp_path / "dst").exists() and not (tmp_path / "dst.npy").exists()
    assert not _leftovers(tmp_path)
    assert np.all(np.isfinite(load_file(src / "model.safetensors")["embeddings.word_embeddings.weight"]))


def test_outputs_get_the_umask_s_mode_or_the_replaced_file_s(src, tmp_path, capsys):
    """Written through a temporary (mkstemp: 0600, mkdtemp: 0700), outputs still get the mode a plain write would
    give them: others can read a converted model or an embedding file under the usual umask 022."""
    old = os.umask(0o027)
    try:
        assert main(["convert", str(src), str(tmp_path / "dst")]) == 0
        assert os.stat(tmp_path / "dst").st_mode & 0o777 == 0o750
        assert {os.stat(tmp_path / "dst" / f).st_mode & 0o777 for f in os.listdir(tmp_path / "dst")} == {0o640}
        (tmp_path / "in.txt").write_text("a text\n")
        out = tmp_path / "e.npy"
        assert main(["embed", str(tmp_path / "dst"), "--input", str(tmp_path / "in.txt"), "--output", str(out)]) == 0
        assert os.stat(out).st_mode & 0o777 == 0o640
        os.chmod(out, 0o604)  # a file replaced keeps its own mode
        assert main(["embed", str(tmp_path / "dst"), "--input", str(tmp_path / "in.txt"), "--output", str(out)]) == 0
        assert os.stat(out).st_mode & 0o777 == 0o604
    finally:
        os.umask(old)


# A writer that is killed outright while it writes: it enters the atomic writer, says so, and waits to be killed.
_WRITER = """
import sys, time
from jaxbert import files
writer = files.atomic_directory if sys.argv[1] == "directory" else files.atomic_file
with writer(sys.argv[2]) as tmp:
    open(tmp + "/weights" if sys.argv[1] == "directory" else tmp, "w").write("half")
    print(tmp, flush=True)
    time.sleep(600)
"""


def _aged(path, seconds=jfiles.STALE_SECONDS + 5):
    past = os.stat(path).st_mtime - seconds
    os.utime(path, (past, past))


@pytest.mark.parametrize("kind", ["directory", "file"])
def test_a_killed_writer_s_temporary_is_swept_by_the_next_writer_a_live_one_s_is_not(tmp_path, kind):
    """kill -9 (no handler runs) leaves `.DST.*.partial`; the next write of DST removes it once no process holds
    its lock, and leaves a live writer's (same output, another process) and a young one. A `.partial.old` (the
    output atomic_directory moved aside to swap in the new one) stays while its writer lives; a dead writer's is
    put back where the output is missing (removed beside one: test_train_reliability's mid-swap test)."""
    out = tmp_path / ("model" if kind == "directory" else "emb.npy")
    live = subprocess.Popen([sys.executable, "-c", _WRITER, kind, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        tmp = live.stdout.readline().strip()
        assert os.path.basename(tmp).startswith(f".{out.name}.") and ".partial" in tmp
        _aged(tmp)
        if kind == "directory":  # as if the writer were between its swap's renames
            os.mkdir(tmp + ".old")
        assert jfiles.sweep_partials(str(out)) == [] and os.path.exists(tmp)  # its writer still holds it
        assert os.path.exists(tmp + ".old") == (kind == "directory") and not out.exists()
        if kind == "directory":
            os.rmdir(tmp + ".old")
    finally:
        live.kill()
        live.wait()
    young, old = tmp_path / f".{out.name}.abcdefgh.partial", tmp_path / f".{out.name}.ijklmnop.partial.old"
    young.mkdir()
    old.mkdir()
    (old / "kept").write_text("complete")
    assert jfiles.sweep_partials(str(out)) == [tmp] and not os.path.exists(tmp)
    assert young.exists() and not old.exists() and (out / "kept").read_text() == "complete"  # put back
    shutil.rmtree(out)
    _aged(young)  # a minute on: nobody holds it, so the next write of the output sweeps it
    with jfiles.atomic_directory(str(out), force=True) if kind == "directory" else jfiles.atomic_file(str(out)):
        pass
    assert sorted(_leftovers(tmp_path)) == []


def test_a_destination_made_meanwhile_is_not_replaced_without_force(src, tmp_path, capsys, monkeypatch):
    """DST was checked for only before the conversion: another process's DST, written while this one converted,
    was then swapped out and deleted without --force (exit 0, their files gone)."""
    import jaxbert.transfer

    dst = tmp_path / "dst"
    real = jaxbert.transfer.write_msgpack

    def meanwhile(*args, **kwargs):
        dst.mkdir()
        (dst / "theirs.txt").write_text("another process's conversion")
        return real(*args, **kwargs)

    monkeypatch.setattr(jaxbert.transfer, "write_msgpack", meanwhile)
    assert main(["convert", str(src), str(dst)]) == 1
    err = capsys.readouterr().err.strip()
    assert "dst: already exists (written meanwhile by another process; use --force" in err and "\n" not in err
    assert os.listdir(dst) == ["theirs.txt"] and not _leftovers(tmp_path)
    (dst / "theirs.txt").unlink()
    dst.rmdir()
    assert main(["convert", str(src), str(dst), "--force"]) == 0  # with --force, the last writer's stays
    assert (dst / "flax_model.msgpack").is_file() and not (dst / "theirs.txt").exists()


def test_a_failed_write_removes_the_parent_directories_it_made(tmp_path):
    """convert SRC out/run1/model failing mid-write (a full disk) left out/run1/ behind, empty: DST's parents
    made for the write go with it; parents that existed stay."""
    (tmp_path / "kept").mkdir()
    for dst in (tmp_path / "out" / "run1" / "model", tmp_path / "kept" / "model"):
        with pytest.raises(OSError, match="No space left"):
            with jfiles.atomic_directory(str(dst)) as tmp:
                open(os.path.join(tmp, "config.json"), "w").close()
                raise OSError(28, "No space left on device")
    assert sorted(os.listdir(tmp_path)) == ["kept"] and os.listdir(tmp_path / "kept") == []
