"""Make a tiny Llama that real vLLM can serve on CPU, with no model hub: random weights, a local tokenizer.

Run with the interpreter of vLLM's virtualenv (it has torch, transformers and tokenizers; greenserve's own
virtualenv does not)::

    .venv-vllm/bin/python services/vllm_cpu/tiny_model.py [--out DIR] [--seed N]

What it writes into DIR (default ``.greenserve/models/tiny-llama``; about 3 MB):

- ``config.json`` + ``model.safetensors``: ``LlamaForCausalLM`` with 2 layers, hidden size 128, 4 attention heads,
  2 KV heads (GQA, as Llama 3), head_dim 32, MLP 256, float32, weights drawn from torch's default initialisation
  under ``--seed``. The weights are random: the text it writes is noise; what is real is everything vLLM does
  around the model (scheduling, paged KV cache, prefix caching, sampling, the OpenAI server, the metrics).
- ``tokenizer.json`` and friends: a byte-level BPE (GPT-2 / Llama 3 style, so any byte string tokenizes) trained
  with ``tokenizers`` on a fixed text in this file (at most 1024 tokens: the model's vocabulary is the
  tokenizer's, so every sampled id decodes), special tokens ``<s>`` (BOS), ``</s>``
  (EOS), ``<pad>`` and the chat roles, and a chat template that vLLM's ``/v1/chat/completions`` applies.

Deterministic: the same seed and this file give the same bytes (tokenizer training on a fixed text is
deterministic; the weights come from a seeded CPU generator). Idempotent: DIR holds a stamp with the hash of
this file and the seed; a second run with both unchanged does nothing. The folder is written beside DIR and
renamed into place, so a crash never leaves a half model that a later run would take as made.

Everything heavy is imported inside ``make`` so that greenserve's own interpreter can import this module for
its constants (``DEFAULT_DIR``, ``stamp_text``) without torch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

#: relative to the working directory, as greenserve up's --data-dir default (.greenserve)
DEFAULT_DIR = Path(".greenserve") / "models" / "tiny-llama"
DEFAULT_SEED = 0
STAMP = ".greenserve-tiny-model"

VOCAB_SIZE = 1024
SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
MODEL_CONFIG = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
    "torch_dtype": "float32",
}

# The tokenizer's training text: fixed, so that the merges (and every token count a test asserts) are the same
# on every machine. English prose about serving plus digits and code-ish punctuation, so that ordinary prompts
# tokenize to a few characters a token, as a real tokenizer would.
_CORPUS = """\
A carbon-aware control plane decides, hour by hour, how a fleet of language model engines is configured and
where each request goes, so that the total carbon of serving is lowest while the latency objectives still hold.
The router dispatches requests to engines by the plan, the live load and the prefix that each engine already
holds in its key-value cache. The time to first token is the wait until the first token of the answer; the time
per output token is the pace of the tokens after it. An engine that holds the prompt's prefix in its cache skips
the prefill of those tokens, and the answer starts sooner. The forecaster predicts the grid's carbon intensity
and the request load for the next day; the optimizer turns forecasts, profiles and objectives into plans.
Grams of carbon dioxide equivalent per kilowatt hour: 0 1 2 3 4 5 6 7 8 9 10 20 50 100 250 500 1000 2024 2025.
def serve(request): return {"model": "tiny", "prompt": request.prompt, "max_tokens": 16, "stream": True}
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How vexingly quick daft
zebras jump! Sphinx of black quartz, judge my vow. Hello, world. You are a helpful assistant. Tell me a story
about the sea, the wind, the mountains and the city at night. What is the weather like today? Please answer in
one sentence. Summarise the document below in three bullet points, then list the open questions.
"""


def stamp_text(seed: int) -> str:
    """What the stamp of a model made by this file with ``seed`` says."""
    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
    return f"tiny-llama seed={seed} maker={digest}\n"


def is_made(out: Path, seed: int = DEFAULT_SEED) -> bool:
    """True when ``out`` holds a model this file made with ``seed``."""
    try:
        return (out / STAMP).read_text() == stamp_text(seed)
    except OSError:
        return False


def _tokenizer(folder: Path) -> int:
    """Trains and saves the tokenizer; returns its vocabulary size (the model's: a sampled id always decodes)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    if tok.get_vocab_size() > VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, more than the model's {VOCAB_SIZE}")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   model_max_length=MODEL_CONFIG["max_position_embeddings"])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(folder))
    for token, want in (("<s>", 0), ("</s>", 1), ("<pad>", 2)):
        if fast.convert_tokens_to_ids(token) != want:
            raise RuntimeError(f"special token {token} got id {fast.convert_tokens_to_ids(token)}, not {want}")
    return int(tok.get_vocab_size())


def _model(folder: Path, seed: int, vocab_size: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**{**MODEL_CONFIG, "vocab_size": vocab_size})
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(str(folder), safe_serialization=True)


def make(out: Path, seed: int = DEFAULT_SEED) -> bool:
    """Writes the tiny model into ``out`` unless it is already there; True when it wrote it."""
    out = out.resolve()
    if is_made(out, seed):
        return False
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        _model(work, seed, _tokenizer(work))
        (work / STAMP).write_text(stamp_text(seed))
        work.chmod(0o755)  # mkdtemp's 0700 would keep an engine run by another user out
        if out.exists():
            shutil.rmtree(out)
        work.rename(out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="make the tiny random-weight Llama that vLLM serves on CPU",
                                     allow_abbrev=False)  # vLLM's interpreter runs this file: no greenserve.common
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR, help=f"model folder (default {DEFAULT_DIR})")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"weights' seed (default {DEFAULT_SEED})")
    ns = parser.parse_args(argv)
    try:
        wrote = make(ns.out, ns.seed)
    except Exception as exc:  # noqa: BLE001 - one line for the caller's log
        print(f"tiny-model: ERROR: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"model": str(ns.out.resolve()), "made": wrote}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
