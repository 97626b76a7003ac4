"""Request workloads for the trace replay: real trace parsers and synthetic generators.

A ``Workload`` is a set of requests sorted by arrival time, held as plain Python lists (fast scalar access
in the replay's inner loop) plus, optionally, per-request prefix-block hashes: identical leading hashes mean
a reusable KV prefix, ``hash_block_tokens`` tokens per block.

Parsers (real public traces; the package ships one of each in ``data/traces/`` beside this module, copied
unchanged from GitHub ``Azure/AzurePublicDataset`` and ``kvcache-ai/Mooncake``; origin, licence and citation in
that folder's SOURCE.md; ``trace_path`` resolves them):

* ``load_azure_csv``: Azure LLM inference trace 2023 (``TIMESTAMP, ContextTokens, GeneratedTokens``;
  no prefix information).
* ``load_mooncake_jsonl``: Mooncake FAST'25 trace (``timestamp`` ms, ``input_length``, ``output_length``,
  ``hash_ids`` of 512-token blocks).

Both parsers take any path, so a user's own trace in either layout replays the same way.

Generators (deterministic for a seed): Poisson or Gamma arrivals with log-normal lengths; GreenCache-style
multi-turn conversations (each turn's prompt extends the previous turn's context, GreenCache Sec. 3.1.1) and
document reading comprehension with Zipf-skewed document popularity (GreenCache Sec. 5.2: skewness alpha 0.4
means 10 % of documents receive ~25 % of prompts).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
import itertools

__all__ = [
    "TRACES_DIR",
    "TRACE_FILES",
    "Workload",
    "load_azure_csv",
    "load_mooncake_jsonl",
    "multi_turn_workload",
    "poisson_workload",
    "trace_path",
    "zipf_document_workload",
]


TRACES_DIR = Path(__file__).resolve().parent / "data" / "traces"
# The traces shipped in TRACES_DIR, by the name the profiler's workloads and the benches use (SOURCE.md there)
TRACE_FILES: dict[str, str] = {
    "azure-conv": "AzureLLMInferenceTrace_conv.csv",  # Azure LLM inference trace 2023, conversation service
    "mooncake": "conversation_trace.jsonl",  # Mooncake FAST'25 conversation hour, 512-token prefix-block hashes
}


def trace_path(name: str) -> Path:
    """The shipped file of trace ``name`` (a key of ``TRACE_FILES``).

    The traces are package data, so every clone and install has them; a missing file means an incomplete
    install, which FileNotFoundError says rather than a parser failing later on a path the user never gave.
    """
    if name not in TRACE_FILES:
        raise ValueError(f"unknown trace {name!r}; known: {', '.join(TRACE_FILES)}")
    path = TRACES_DIR / TRACE_FILES[name]
    if not path.is_file():
        raise FileNotFoundError(f"trace {name!r} is missing from the installed package ({path}); "
                                "reinstall greenserve: it ships greenserve/simulator/data/traces/")
    return path


@dataclass
class Workload:
    """Requests sorted by ``arrival_s``; ``block_hashes[i]`` is a tuple of prefix-block ids (may be empty)."""

    name: str
    arrival_s: list[float]
    prompt_tokens: list[int]
    output_tokens: list[int]
    block_hashes: list[tuple[int, ...]] = field(default_factory=list)
    hash_block_tokens: int = 512
    session_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if len(self.prompt_tokens) != n or len(self.output_tokens) != n:
            raise ValueError("prompt_tokens: arrival_s, prompt_tokens and output_tokens must have the same length")
        if self.block_hashes and len(self.block_hashes) != n:
            raise ValueError("block_hashes: must be empty or one tuple per request")
        if self.session_ids and len(self.session_ids) != n:
            raise ValueError("session_ids: must be empty or one id per request")
        if self.hash_block_tokens < 1:
            raise ValueError("hash_block_tokens: must be >= 1")
        if n:
            arr = np.asarray(self.arrival_s, dtype=np.float64)
            if not np.all(np.isfinite(arr)) or np.any(np.diff(arr) < 0):
                raise ValueError("arrival_s: must be finite and sorted")
            if min(self.prompt_tokens) < 1:
                raise ValueError("prompt_tokens: every request needs at least one prompt token")
            if min(self.output_tokens) < 1:
                raise ValueError("output_tokens: every request generates at least one token")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        """Seconds from the first to the last arrival."""
        return self.arrival_s[-1] - self.arrival_s[0] if self.arrival_s else 0.0

    def head(self, n: int) -> Workload:
        """The first ``n`` requests."""
        return Workload(self.name, self.arrival_s[:n], self.prompt_tokens[:n], self.output_tokens[:n],
                        self.block_hashes[:n], self.hash_block_tokens, self.session_ids[:n])

    def window(self, start_s: float, end_s: float) -> Workload:
        """Requests with ``start_s <= arrival < end_s``, re-based so the window starts at 0."""
        arr = np.asarray(self.arrival_s)
        lo, hi = int(np.searchsorted(arr, start_s, "left")), int(np.searchsorted(arr, end_s, "left"))
        return Workload(self.name, [a - start_s for a in self.arrival_s[lo:hi]], self.prompt_tokens[lo:hi],
                        self.output_tokens[lo:hi], self.block_hashes[lo:hi], self.hash_block_tokens,
                        self.session_ids[lo:hi])

    def scaled(self, rate_factor: float) -> Workload:
        """The same requests arriving ``rate_factor`` times faster (inter-arrival times divided)."""
        if not rate_factor > 0:
            raise ValueError("rate_factor: must be > 0")
        t0 = self.arrival_s[0] if self.arrival_s else 0.0
        return Workload(f"{self.name}x{rate_factor:g}", [t0 + (a - t0) / rate_factor for a in self.arrival_s],
                        self.prompt_tokens, self.output_tokens, self.block_hashes, self.hash_block_tokens,
                        self.session_ids)


# -----------------------------------------------------------------------------------------------------
# Real traces
# -----------------------------------------------------------------------------------------------------


def _parse_azure_time(text: str) -> float:
    # "2023-11-16 18:15:46.6805900": 7 fractional digits (100 ns); datetime takes at most 6
    text = text.strip()
    if "." in text:
        head, frac = text.split(".", 1)
        frac = (frac + "000000")[:6]
        text = f"{head}.{frac}"
    return datetime.fromisoformat(text).timestamp()


def load_azure_csv(path: str | Path, limit: int | None = None, max_seconds: float | None = None) -> Workload:
    """Parse an Azure LLM inference trace CSV (``TIMESTAMP, ContextTokens, GeneratedTokens``).

    Arrival times are seconds since the first row. ``max_seconds`` keeps only that much of the trace
    (e.g. 3600 for "the first hour"), ``limit`` at most that many rows. Rows with zero generated tokens
    are kept as one-token outputs (an engine always emits at least one token).
    Raises ``ValueError`` naming the line on a malformed row.
    """
    path = Path(path)
    arrival: list[float] = []
    prompt: list[int] = []
    output: list[int] = []
    t0: float | None = None
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        needed = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
        if reader.fieldnames is None or not needed <= set(reader.fieldnames):
            raise ValueError(f"{path.name}: header must contain {sorted(needed)}, got {reader.fieldnames}")
        for line_no, row in enumerate(reader, start=2):
            try:
                t = _parse_azure_time(row["TIMESTAMP"])
                ctx = int(row["ContextTokens"])
                gen = int(row["GeneratedTokens"])
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{path.name}:{line_no}: malformed row ({exc})") from None
            if ctx < 0 or gen < 0:
                raise ValueError(f"{path.name}:{line_no}: negative token count")
            if t0 is None:
                t0 = t
            rel = t - t0
            if max_seconds is not None and rel >= max_seconds:
                break
            arrival.append(rel)
            prompt.append(max(ctx, 1))
            output.append(max(gen, 1))
            if limit is not None and len(arrival) >= limit:
                break
    if arrival and any(b < a for a, b in itertools.pairwise(arrival)):
        order = sorted(range(len(arrival)), key=arrival.__getitem__)
        arrival = [arrival[i] for i in order]
        prompt = [prompt[i] for i in order]
        output = [output[i] for i in order]
    return Workload(path.stem, arrival, prompt, output, [], 512)


def load_mooncake_jsonl(path: str | Path, limit: int | None = None, max_seconds: float | None = None) -> Workload:
    """Parse a Mooncake trace (JSON Lines: ``timestamp`` ms, ``input_length``, ``output_length``,
    ``hash_ids`` of 512-token blocks). Raises ``ValueError`` naming the line on a malformed record."""
    path = Path(path)
    arrival: list[float] = []
    prompt: list[int] = []
    output: list[int] = []
    hashes: list[tuple[int, ...]] = []
    with open(path) as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                t = float(rec["timestamp"]) / 1000.0
                n_in = int(rec["input_length"])
                n_out = int(rec["output_length"])
                ids = tuple(int(h) for h in rec.get("hash_ids", ()))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path.name}:{line_no}: malformed record ({exc!r})") from None
            if n_in < 0 or n_out < 0 or not math.isfinite(t):
                raise ValueError(f"{path.name}:{line_no}: negative length or bad timestamp")
            if max_seconds is not None and t >= max_seconds:
                break
            arrival.append(t)
            prompt.append(max(n_in, 1))
            output.append(max(n_out, 1))
            hashes.append(ids)
            if limit is not None and len(arrival) >= limit:
                break
    return Workload(path.stem, arrival, prompt, output, hashes, 512)


# -----------------------------------------------------------------------------------------------------
# Synthetic
# -----------------------------------------------------------------------------------------------------


def _arrivals(rng: np.random.Generator, n: int, rate_per_s: float, arrival: str, cv: float) -> np.ndarray:
    if rate_per_s <= 0:
        raise ValueError("rate_per_s: must be > 0")
    if arrival == "poisson":
        gaps = rng.exponential(1.0 / rate_per_s, n)
    elif arrival == "gamma":
        if cv <= 0:
            raise ValueError("cv: must be > 0")
        shape = 1.0 / (cv * cv)
        gaps = rng.gamma(shape, 1.0 / (rate_per_s * shape), n)
    else:
        raise ValueError(f"arrival: must be 'poisson' or 'gamma', got {arrival!r}")
    return np.cumsum(gaps)


def _lognormal_tokens(rng: np.random.Generator, n: int, mean: float, sigma: float, lo: int, hi: int) -> np.ndarray:
    mu = math.log(mean) - sigma * sigma / 2.0
    return np.clip(np.rint(rng.lognormal(mu, sigma, n)), lo, hi).astype(np.int64)


def poisson_workload(n: int, rate_per_s: float, *, seed: int = 0, arrival: str = "poisson", cv: float = 1.0,
                     mean_prompt_tokens: float = 1024, mean_output_tokens: float = 256, sigma: float = 0.8,
                     max_prompt_tokens: int = 32768, max_output_tokens: int = 2048) -> Workload:
    """``n`` independent requests with Poisson (or Gamma, coefficient of variation ``cv``) arrivals and
    log-normal prompt/output lengths; no shared prefixes."""
    if n < 0:
        raise ValueError("n: must be >= 0")
    rng = np.random.default_rng(seed)
    t = _arrivals(rng, n, rate_per_s, arrival, cv)
    p = _lognormal_tokens(rng, n, mean_prompt_tokens, sigma, 1, max_prompt_tokens)
    o = _lognormal_tokens(rng, n, mean_output_tokens, sigma, 1, max_output_tokens)
    return Workload(f"{arrival}-{rate_per_s:g}rps", t.tolist(), p.tolist(), o.tolist(), [], 256)


def multi_turn_workload(n_conversations: int, rate_per_s: float, *, seed: int = 0, mean_turns: float = 4.0,
                        mean_user_tokens: float = 300, mean_output_tokens: float = 250, think_time_s: float = 30.0,
                        system_prompt_tokens: int = 200, max_context_tokens: int = 8192,
                        block_tokens: int = 256) -> Workload:
    """GreenCache-style multi-turn chat (ShareGPT-like): conversations start as a Poisson process; each turn's
    prompt is the whole history (system prompt, previous user turns and answers) plus a new user message,
    truncated to the last ``max_context_tokens`` (GreenCache Sec. 6.1: 8k context window). A turn arrives
    ``think_time_s`` (exponential) after the previous one was sent. Block hashes: the history's blocks keep
    their ids across turns, so the next turn's prompt shares a prefix with the previous one."""
    if n_conversations < 0 or mean_turns < 1 or block_tokens < 1:
        raise ValueError("n_conversations: must be >= 0 with mean_turns >= 1 and block_tokens >= 1")
    rng = np.random.default_rng(seed)
    starts = _arrivals(rng, n_conversations, rate_per_s, "poisson", 1.0)
    system_ids = tuple(range(-(system_prompt_tokens // block_tokens) - 1, -1))  # shared by every conversation
    rows: list[tuple[float, int, int, tuple[int, ...], int]] = []
    next_id = 1
    for conv, start in enumerate(starts):
        turns = int(rng.geometric(1.0 / mean_turns))  # geometric, mean = mean_turns
        history = system_prompt_tokens
        t = float(start)
        ids: list[int] = list(system_ids)
        for _ in range(max(turns, 1)):
            user = int(_lognormal_tokens(rng, 1, mean_user_tokens, 0.8, 4, 4096)[0])
            out = int(_lognormal_tokens(rng, 1, mean_output_tokens, 0.8, 1, 2048)[0])
            prompt = history + user
            full_blocks = prompt // block_tokens
            while len(ids) < full_blocks:
                ids.append(next_id)
                next_id += 1
            if prompt > max_context_tokens:  # truncated from the front: the prefix changes, no reuse
                prompt = max_context_tokens
                block_ids = tuple(range(next_id, next_id + prompt // block_tokens))
                next_id += prompt // block_tokens
            else:
                block_ids = tuple(ids[:full_blocks])
            rows.append((t, prompt, out, block_ids, conv))
            history = history + user + out
            t += float(rng.exponential(think_time_s))
    rows.sort(key=lambda r: r[0])
    return Workload(f"multiturn-{rate_per_s:g}cps", [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows],
                    [r[3] for r in rows], block_tokens, [r[4] for r in rows])


def zipf_document_workload(n: int, rate_per_s: float, *, n_documents: int = 1000, alpha: float = 0.4, seed: int = 0,
                           mean_document_tokens: float = 5880, mean_question_tokens: float = 40,
                           mean_output_tokens: float = 64, max_context_tokens: int = 8192,
                           block_tokens: int = 256) -> Workload:
    """GreenCache-style document reading comprehension (TriviaQA-like): each prompt is one document plus a
    question; documents are drawn with Zipf skew ``alpha`` (P(rank r) ~ r^-alpha). Mean document length
    5,880 tokens is GreenCache Sec. 3.1.1's TriviaQA figure; contexts are truncated to 8k (Sec. 6.1)."""
    if n < 0 or n_documents < 1 or alpha < 0:
        raise ValueError("n_documents: must be >= 1 with n >= 0 and alpha >= 0")
    rng = np.random.default_rng(seed)
    t = _arrivals(rng, n, rate_per_s, "poisson", 1.0)
    ranks = np.arange(1, n_documents + 1, dtype=np.float64)
    weights = ranks ** -alpha
    weights /= weights.sum()
    docs = rng.choice(n_documents, size=n, p=weights)
    doc_len = _lognormal_tokens(rng, n_documents, mean_document_tokens, 0.5, 256, max_context_tokens)
    question = _lognormal_tokens(rng, n, mean_question_tokens, 0.5, 4, 512)
    output = _lognormal_tokens(rng, n, mean_output_tokens, 0.6, 1, 1024)
    max_blocks = max_context_tokens // block_tokens + 1
    prompts, hashes = [], []
    for i in range(n):
        d = int(docs[i])
        prompt = min(int(doc_len[d]) + int(question[i]), max_context_tokens)
        nblocks = min(int(doc_len[d]), prompt) // block_tokens
        hashes.append(tuple(d * max_blocks + b for b in range(nblocks)))
        prompts.append(prompt)
    return Workload(f"zipfdocs-a{alpha:g}", t.tolist(), prompts, output.tolist(), hashes, block_tokens,
                    docs.tolist())
