"""Deterministic tokenizer approximation and filler text for the engine emulator.

The emulator has no model weights, so it has no real tokenizer. It needs token *counts* that
behave like a BPE tokenizer's (about 4 characters of plain English per token, about 3.5 on
markdown-heavy text; punctuation split off; long words split into several pieces) and token *ids* that are stable across processes, so that
the prefix cache hashes the same prompt to the same blocks in every run.

Rule (documented so clients can predict counts):
  1. split the text with the regex ``\\s*\\w+|\\s*[^\\w\\s]`` (a word or one punctuation mark,
     carrying its leading whitespace, as GPT-style pre-tokenizers do);
  2. every piece longer than 6 characters (leading space included) is cut into 6-character pieces;
  3. a piece's id is ``crc32(piece) % VOCAB_SIZE`` (stable, independent of PYTHONHASHSEED).
Empty text has zero tokens. Trailing whitespace alone is dropped.
"""

from __future__ import annotations

import json
import re
import zlib
from functools import lru_cache

#: vocabulary size of the approximated tokenizer (Llama-3's is 128,256).
VOCAB_SIZE = 128_256
#: longest piece kept as one token; GPT/Llama-3 BPE vocabularies hold most words of up to five
#: letters (with their leading space) as single tokens, which gives ~4 characters/token on English
MAX_PIECE_CHARS = 6

_PIECE_RE = re.compile(r"\s*\w+|\s*[^\w\s]")


@lru_cache(maxsize=65_536)
def _piece_id(piece: str) -> int:
    return zlib.crc32(piece.encode("utf-8")) % VOCAB_SIZE


def tokenize(text: str) -> list[int]:
    """Token ids of ``text`` under the approximation described in the module docstring."""
    ids: list[int] = []
    append = ids.append
    for match in _PIECE_RE.finditer(text):
        piece = match.group()
        if len(piece) <= MAX_PIECE_CHARS:
            append(_piece_id(piece))
        else:
            for start in range(0, len(piece), MAX_PIECE_CHARS):
                append(_piece_id(piece[start : start + MAX_PIECE_CHARS]))
    return ids


#: chat roles accepted in ``messages`` (OpenAI's set, incl. the newer ``developer``).
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def apply_chat_template(messages: list[tuple[str, str]], add_generation_prompt: bool = True) -> str:
    """Flatten ``(role, content)`` pairs with a simple Llama-3-like template.

    ``<|role|>\\ncontent<|end|>\\n`` per message, then ``<|assistant|>\\n`` for the reply. The
    template adds a few tokens per message, like real chat templates do.
    """
    parts = [f"<|{role}|>\n{content}<|end|>\n" for role, content in messages]
    if add_generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)


# Filler text: a fixed cycle of common English words; each is one generated token.
_FILLER_WORDS = ["the", "model", "is", "an", "emulated", "engine", "and", "this", "text", "is", "deterministic", "filler", "so", "that", "clients", "can", "count", "tokens", "check", "streaming", "and", "measure", "latency", "without", "a", "GPU", "while", "the", "prefix", "cache", "and", "the", "batch", "scheduler", "behave", "like", "a", "real", "serving", "engine", "would", "under", "load"]
#: generated token texts, in the order they are produced (token i is FILLER_TOKENS[i % len]).
FILLER_TOKENS: tuple[str, ...] = tuple(" " + w for w in _FILLER_WORDS)
#: the same texts as JSON string literals (quotes included), precomputed for the SSE hot path.
FILLER_TOKENS_JSON: tuple[str, ...] = tuple(json.dumps(t) for t in FILLER_TOKENS)
#: number of distinct filler tokens (the cycle length).
FILLER_CYCLE = len(FILLER_TOKENS)


def filler_text(start: int, count: int) -> str:
    """Concatenated text of generated tokens ``start .. start+count-1``."""
    return "".join(FILLER_TOKENS[i % FILLER_CYCLE] for i in range(start, start + count))


_CYCLE_OFFSETS: tuple[int, ...] = tuple(sum(len(t) for t in FILLER_TOKENS[:i]) for i in range(FILLER_CYCLE + 1))


def filler_offset(index: int) -> int:
    """Character offset in the generated text where generated token ``index`` starts."""
    cycles, rest = divmod(index, FILLER_CYCLE)
    return cycles * _CYCLE_OFFSETS[FILLER_CYCLE] + _CYCLE_OFFSETS[rest]
