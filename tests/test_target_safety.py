"""What a careless user (or a hostile folder) can do around an artifact, and that none of it
loses a file, loads a file the manifest does not vouch for, or runs planted code. Each case
runs the real CLI on a tiny llama or an artifact of it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from compress.artifact import writer as writer_module
from compress.artifact.target import claim, lock_path
from tests.conftest import write_tiny_llama
from tests.test_bad_input import error_lines, run_cli


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, tokenizer) -> Path:
    folder = write_tiny_llama(tmp_path_factory.mktemp("tiny") / "model", vocab_size=49152)
    tokenizer.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def tiny_artifact(tmp_path_factory, tiny_model) -> Path:
    out = tmp_path_factory.mktemp("art") / "a"
    code, _, err = run_cli(["compress", str(tiny_model), "-o", str(out), "--quant", "rtn:w4g64"])
    assert code == 0, err
    return out


def _copy(artifact: Path, tmp: Path) -> Path:
    dst = tmp / "copy"
    shutil.copytree(artifact, dst)
    return dst


def _compress(model: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    return run_cli(["compress", str(model), "-o", str(out), "--quant", "rtn:w4g64", *extra])


def test_a_folder_made_at_the_target_during_the_run_is_kept(tiny_model, tmp_path, monkeypatch):
    """The user creates -o while the run works: their file survives, the artifact goes
    beside it under a visible name, and the run says so (exit 2)."""
    out = tmp_path / "race7"
    real = writer_module.ArtifactWriter.add_block

    def user_mkdir_meanwhile(self, index):
        if not out.exists():
            out.mkdir()
            (out / "mydata.txt").write_text("precious")
        return real(self, index)

    monkeypatch.setattr(writer_module.ArtifactWriter, "add_block", user_mkdir_meanwhile)
    code, _, err = _compress(tiny_model, out)
    assert code == 2, err
    assert (out / "mydata.txt").read_text() == "precious"
    assert sorted(p.name for p in out.iterdir()) == ["mydata.txt"]
    line = error_lines(err)[0]
    assert "left untouched" in line
    diverted = [p for p in tmp_path.iterdir() if p.name.startswith("race7.llmpress-")]
    assert len(diverted) == 1 and (diverted[0] / "manifest.json").is_file()
    assert str(diverted[0]) in line
    assert run_cli(["verify", str(diverted[0])])[0] == 0


def test_an_empty_folder_made_at_the_target_is_not_replaced(tiny_model, tmp_path, monkeypatch):
    out = tmp_path / "race8"
    real = writer_module.ArtifactWriter.finish

    def user_mkdir_meanwhile(self, *args):
        out.mkdir()
        return real(self, *args)

    monkeypatch.setattr(writer_module.ArtifactWriter, "finish", user_mkdir_meanwhile)
    code, _, err = _compress(tiny_model, out)
    assert code == 2 and "left untouched" in err
    assert out.is_dir() and not any(out.iterdir())


def test_a_second_run_to_the_same_target_is_refused_at_once(tiny_model, tmp_path):
    out = tmp_path / "both"
    with claim(out):
        code, _, err = _compress(tiny_model, out)
    assert code == 2 and "another llmpress run" in error_lines(err)[0]
    assert not out.exists()
    assert not lock_path(out).exists()  # released by its holder


def test_a_lock_left_by_a_killed_run_is_taken_over(tiny_model, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "out"
    lock_path(out).write_text(f"{dead.pid} {socket.gethostname()}\n")
    code, _, err = _compress(tiny_model, out)
    assert code == 0, err
    assert (out / "manifest.json").is_file() and not lock_path(out).exists()


def test_overwrite_keeps_the_users_own_files(tiny_model, tiny_artifact, tmp_path):
    art = _copy(tiny_artifact, tmp_path)
    (art / "NOTES.txt").write_text("mine")
    (art / "my_notes").mkdir()
    (art / "my_notes" / "a.md").write_text("also mine")
    code, _, err = _compress(tiny_model, art, "--overwrite")
    assert code == 0, err
    assert (art / "NOTES.txt").read_text() == "mine"
    assert (art / "my_notes" / "a.md").read_text() == "also mine"
    assert run_cli(["verify", str(art)])[0] == 1  # unlisted notes: reported, not removed
    assert run_cli(["inspect", str(art)])[0] == 0  # and allowed for loading


def test_overwrite_refuses_a_gguf_inside_the_target(default_ckpt, artifacts, tmp_path):
    from compress.model.default import default_gguf

    art = _copy(artifacts["rtn:w4g64"], tmp_path)
    gguf = art / "mymodel.gguf"
    os.link(default_gguf(), gguf)  # the same file, without copying 100 MB
    before = gguf.stat().st_size
    code, _, err = run_cli(
        ["compress", str(gguf), "-o", str(art), "--quant", "rtn:w4g64", "--overwrite"]
    )
    assert code == 2 and "model being compressed" in error_lines(err)[0]
    assert gguf.stat().st_size == before


def test_stale_cleanup_leaves_look_alike_user_folders(tiny_model, tmp_path):
    out = tmp_path / "mydata"
    old = time.time() - 3 * 3600
    for name in (".mydata.old-2024", ".mydata.partial-notes"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "keep.txt").write_text("mine")
        os.utime(tmp_path / name, (old, old))
    code, _, err = _compress(tiny_model, out)
    assert code == 0, err
    for name in (".mydata.old-2024", ".mydata.partial-notes"):
        assert (tmp_path / name / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("command", [["eval", "--windows", "1", "--ctx", "32"], ["inspect"]])
def test_an_unlisted_weight_file_is_refused(tiny_artifact, tiny_model, tmp_path, command):
    """A shard the manifest does not list would be read by the loader: refused in one
    line instead of computing with it."""
    art = _copy(tiny_artifact, tmp_path)
    save_file({"model.norm.weight": torch.full((64,), 50.0)}, str(art / "zz-extra.safetensors"))
    argv = [command[0], str(art), *command[1:]]
    if command[0] == "eval":
        argv += ["--base", str(tiny_model), "--data", "self", "--no-record"]
    code, _, err = run_cli(argv)
    assert code == 2, err
    assert "zz-extra.safetensors" in error_lines(err)[0] and "remove it" in err


def test_push_uploads_only_the_listed_files_and_refuses_an_unlisted_shard(tiny_artifact, tmp_path):
    art = _copy(tiny_artifact, tmp_path)
    (art / "NOTES.txt").write_text("private")
    code, out, err = run_cli(["push", str(art), "--repo", "me/tiny", "--dry-run"])
    assert code == 0, err
    assert "NOTES.txt" not in out and "model.safetensors" in out
    save_file({"model.norm.weight": torch.ones(64)}, str(art / "zz-extra.safetensors"))
    code, _, err = run_cli(["push", str(art), "--repo", "me/tiny", "--dry-run"])
    assert code == 2 and "zz-extra.safetensors" in error_lines(err)[0]


def _rehash(art: Path) -> None:
    """What an attacker (or a careless script) does after editing: fix the manifest's hashes."""
    from compress.artifact.integrity import file_hashes

    manifest = json.loads((art / "manifest.json").read_text())
    manifest["sha256"] = file_hashes(art)
    manifest["sizes"]["files"] = {n: (art / n).stat().st_size for n in manifest["sha256"]}
    (art / "manifest.json").write_text(json.dumps(manifest))


def test_a_truncated_packed_weight_is_refused_even_when_rehashed(
    tiny_artifact, tiny_model, tmp_path
):
    art = _copy(tiny_artifact, tmp_path)
    tensors = load_file(str(art / "model.safetensors"))
    name = "model.layers.0.self_attn.q_proj.weight_packed"
    tensors[name] = tensors[name][:, :7].contiguous()
    save_file(tensors, str(art / "model.safetensors"), metadata={"format": "pt"})
    _rehash(art)
    assert run_cli(["verify", str(art)])[0] == 0  # the hashes agree with the damage
    argv = ["eval", str(art), "--base", str(tiny_model), "--windows", "1", "--ctx", "32"]
    code, _, err = run_cli([*argv, "--no-record"])
    assert code == 2 and "weight_packed has shape [64, 7]" in error_lines(err)[0], err


@pytest.mark.parametrize("value", ["notadict", {"../../secret.txt": "0" * 64}])
def test_a_malformed_manifest_hash_table_is_one_line(tiny_artifact, tmp_path, value):
    art = _copy(tiny_artifact, tmp_path / "in")
    (tmp_path / "secret.txt").write_text("outside")
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["sha256"] = value if isinstance(value, str) else {**manifest["sha256"], **value}
    (art / "manifest.json").write_text(json.dumps(manifest))
    code, out, err = run_cli(["verify", str(art)])
    assert code == 1 and "Traceback" not in err
    assert "not a table" in out if isinstance(value, str) else "not a file of this folder" in out
    code, _, err = run_cli(["inspect", str(art)])
    assert code == 2 and len(error_lines(err)) == 1, err


def test_an_index_pointing_outside_the_folder_is_refused(tiny_model, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    shutil.move(model / "model.safetensors", tmp_path / "outside.safetensors")
    names = load_file(str(tmp_path / "outside.safetensors")).keys()
    index = {"metadata": {}, "weight_map": dict.fromkeys(names, "../outside.safetensors")}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    code, _, err = run_cli(["inspect", str(model)])
    assert code == 2 and "not a .safetensors file in the folder" in error_lines(err)[0]


def test_two_files_holding_the_same_tensor_are_refused(tiny_model, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    save_file({"model.norm.weight": torch.ones(64)}, str(model / "zz-extra.safetensors"))
    code, _, err = run_cli(["inspect", str(model)])
    assert code == 2 and "model.norm.weight is in both" in error_lines(err)[0]


def test_eval_on_a_read_only_artifact_prints_results_then_says_it_could_not_record(
    tiny_artifact, tiny_model, tmp_path, monkeypatch
):
    art = _copy(tiny_artifact, tmp_path)
    from compress.artifact import manifest as manifest_module

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(manifest_module, "_atomic_write", read_only)
    argv = ["eval", str(art), "--base", str(tiny_model), "--windows", "1", "--ctx", "32"]
    code, out, err = run_cli([*argv, "--gate", "kl<=100", "--json", str(tmp_path / "r.json")])
    assert code == 0, err
    assert "as served (int8 activations, int8 KV cache)" in out  # the default KV cache
    assert "weights only (exact)" in out
    assert "gate PASS kl" in out and (tmp_path / "r.json").is_file()
    assert "could not record" in err and "--no-record" in err


def test_resume_never_unpickles_a_planted_checkpoint(tmp_path):
    """A checkpoint is loaded as data: a pickle that would run code is refused."""
    from compress.distill.loop import _load_checkpoint

    marker = tmp_path / "ran"

    class Planted:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "distill-0123456789abcdef.pt"
    torch.save({"run_id": "0123456789abcdef", "x": Planted()}, path)
    from compress.errors import LlmpressError

    with pytest.raises(LlmpressError, match="not a readable llmpress checkpoint"):
        _load_checkpoint(path)
    assert not marker.exists()
