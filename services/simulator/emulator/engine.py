"""Continuous-batching engine loop of the emulator, paced in real time by the performance model.

One asyncio task plays vLLM V1's scheduler and model runner:

1. every step it schedules the running requests first (one decode token each, or the next chunk of
   a prompt that is still prefilling), then admits waiting requests in FIFO order while fewer than
   ``max_num_seqs`` run, the step's token budget (``max_num_batched_tokens``) lasts, and the KV pool
   has blocks for the prompt's uncached part; the prompt's cached prefix (prefix cache) is skipped;
2. when a running request needs a new KV block and none is free, the most recently admitted request
   is preempted (its blocks released, recomputed later), as vLLM's recompute preemption does;
3. it sleeps the step's modelled duration ``x slow_factor / time_scale`` (deadline-based, so Python
   overhead does not add up), then applies the step: prefill progress, one token per request that
   finished its prefill or decoded, finish checks, metrics, and wakes the HTTP handlers.

Sleep mode (``sleep`` / ``wake_up``, vLLM's semantics: sleep_mode.py): the scheduler is paused, the requests held
are aborted, finished or frozen as the sleep's mode says, the KV blocks and the prefix cache are emptied, and
requests that arrive meanwhile are held until the engine is awake again.

Time: the engine keeps a modelled clock (seconds of the modelled engine). It advances by each step's
modelled duration and, while idle, by wall-clock time x ``time_scale``. All latencies in metrics
are on this clock, so they do not depend on the host's speed as long as the host keeps up.
"""

from __future__ import annotations

import asyncio

from greenserve.common.tasks import cancel_and_wait
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from greenserve.simulator.emulator.faults import FaultState
from greenserve.simulator.emulator.metrics import EngineMetrics
from greenserve.simulator.emulator.pacing import EngineShape, StepTimer
from greenserve.simulator.emulator.prefix_cache import (
    BlockPool,
    block_hashes,
    blocks_for_tokens,
)
from greenserve.simulator.emulator.sleep_mode import SLEEP_LEVELS, SLEEP_MODES
from greenserve.simulator.emulator.tokenizer import filler_offset, filler_text

#: how far (wall seconds) the loop may fall behind its deadlines before it stops catching up.
MAX_LAG_S = 0.05


class RequestAborted(Exception):
    """The engine dropped the request (client gone, engine crash, stream fault)."""


@dataclass(eq=False)
class EngineRequest:
    """One generation request as the engine sees it."""

    request_id: str
    prompt_token_ids: Sequence[int]
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    #: per-token probability of a pseudo end-of-sequence (0 = always generate max_tokens)
    eos_probability: float = 0.0
    eos_seed: int = 0

    # -- scheduler state --
    block_hashes: list[int] = field(default_factory=list)
    prefill_target: int = 0
    num_computed_tokens: int = 0
    held_hashes: list[int] = field(default_factory=list)
    fresh_blocks: int = 0
    running: bool = False
    admitted_once: bool = False

    # -- outputs (read by the HTTP handler) --
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: str | None = None
    #: characters of generated text that may be shown (set when a stop string cut it)
    text_limit_chars: int | None = None
    error: str | None = None

    # -- timing on the engine clock --
    arrival_s: float = 0.0
    scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float = 0.0

    _waiter: asyncio.Future[None] | None = None
    _eos_rng: random.Random | None = None
    #: event-loop time at which the request was queued (None in virtual time)
    _arrival_wall: float | None = None

    @property
    def prompt_tokens(self) -> int:
        """Prompt length in tokens."""
        return len(self.prompt_token_ids)

    def wake(self) -> None:
        """Wake the handler waiting on this request (cheap no-op when nobody waits)."""
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait_update(self) -> None:
        """Wait until the engine produced tokens, finished or dropped this request."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._waiter = fut
        try:
            await fut
        finally:
            self._waiter = None


@dataclass
class _StepPlan:
    prefill: list[tuple[EngineRequest, int]]
    decode: list[EngineRequest]
    duration_s: float
    power_w: float


class EmulatedEngine:
    """Scheduler + paced step loop of one emulated engine."""

    def __init__(
        self,
        shape: EngineShape,
        timer: StepTimer,
        metrics: EngineMetrics,
        faults: FaultState,
        *,
        time_scale: float = 1.0,
        max_num_seqs: int = 256,
        transfer_power_w: float | None = None,
    ) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        self.shape = shape
        self.timer = timer
        self.metrics = metrics
        self.faults = faults
        self.time_scale = time_scale
        self.max_num_seqs = max_num_seqs
        self.pool = BlockPool(shape.num_gpu_blocks, shape.block_size_tokens)
        metrics.block_size_tokens = shape.block_size_tokens
        metrics.num_gpu_blocks = shape.num_gpu_blocks
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.steps = 0
        self._task: asyncio.Task[None] | None = None
        self._work: asyncio.Event | None = None
        self._resume: asyncio.Event | None = None
        self._clock_s = 0.0
        self._clock_wall = 0.0
        self._step_in_flight_s = 0.0
        self._idle = True
        # modelled energy: idle power over the whole clock plus each finished step's draw above idle
        self._step_extra_energy_j = 0.0
        metrics.engine_power_w = timer.idle_power_w
        metrics.energy_j = self.energy_j
        # sleep mode (sleep_mode.py): 0 awake, else the level it sleeps at
        self.sleep_level = 0
        #: draw while the weights move over the host link (a sleep's offload, a wake-up's load)
        self.transfer_power_w = timer.idle_power_w if transfer_power_w is None else float(transfer_power_w)
        self._held: deque[EngineRequest] = deque()  # arrived while the scheduler is paused for sleep
        self._hold_new = False  # new requests are held (a sleep is under way or in force)
        self._paused = False  # no step runs (asleep, or going to sleep)
        self._transferring = False
        self._sleep_lock: asyncio.Lock | None = None  # sleep, wake-up and is_sleeping run one after another
        self._emptied: asyncio.Event | None = None  # set whenever nothing runs or waits

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Start the step loop in the running event loop."""
        loop = asyncio.get_running_loop()
        self._work = asyncio.Event()
        self._resume = asyncio.Event()
        self._sleep_lock = asyncio.Lock()
        self._emptied = asyncio.Event()
        if not self.faults.hang:
            self._resume.set()
        self._clock_wall = loop.time()
        self._task = loop.create_task(self._run(), name="greenserve-engine-sim-steps")

    async def stop(self) -> None:
        """Stop the loop and drop every request."""
        await cancel_and_wait(self._task)
        self._task = None
        self.abort_all("engine stopped")

    # -- clock ------------------------------------------------------------------------------
    def now_s(self) -> float:
        """Current time on the engine's modelled clock.

        Idle (or hung), the clock follows wall time x ``time_scale``. While steps run it moves only
        by the steps' modelled durations: an arrival during a step lands inside that step, and the
        host's own overhead between steps is not counted as engine time.
        """
        elapsed = (asyncio.get_running_loop().time() - self._clock_wall) * self.time_scale
        if not self._idle:
            elapsed = min(elapsed, self._step_in_flight_s)
        return self._clock_s + max(0.0, elapsed)

    def energy_j(self) -> float:
        """Modelled energy (joules) the engine drew since it started, on its modelled clock: idle power over
        all of it plus, for every finished step, its power above idle x its modelled duration."""
        try:
            now = self.now_s()
        except RuntimeError:  # read outside the event loop: up to the last finished step or idle period
            now = self._clock_s
        return self.timer.idle_power_w * now + self._step_extra_energy_j

    # -- requests ---------------------------------------------------------------------------
    def add_request(self, req: EngineRequest) -> None:
        """Queue a request (it shows in ``num_requests_waiting`` until admitted); while the engine sleeps, or is
        going to sleep, it is held until it is awake again (vLLM's paused scheduler)."""
        self._enqueue(req, self.now_s())
        req._arrival_wall = asyncio.get_running_loop().time()
        if self._hold_new:
            self.waiting.remove(req)
            self._held.append(req)
            self._update_gauges()
        assert self._work is not None
        self._work.set()

    def _enqueue(self, req: EngineRequest, arrival_s: float) -> None:
        req.arrival_s = arrival_s
        req.prefill_target = req.prompt_tokens
        req.block_hashes = block_hashes(req.prompt_token_ids, self.shape.block_size_tokens)
        if req.eos_probability > 0 and not req.ignore_eos:
            req._eos_rng = random.Random(hash((req.eos_seed, tuple(req.prompt_token_ids))))
        self.waiting.append(req)
        self.metrics.num_requests_waiting = len(self.waiting)

    def run_virtual(self, arrivals: Sequence[tuple[float, EngineRequest]]) -> None:
        """Serve ``arrivals`` (modelled arrival time, request) to completion on the modelled clock alone: no
        event loop and no pacing, each step lasting its modelled duration, a request that arrives during a step
        joining the next one. The requests' timings and the metrics are what the engine records in real time on a
        host that keeps up; the difference between the two is the host's (pacing, HTTP front). Do not mix with
        ``start``."""
        pending = deque(sorted(arrivals, key=lambda a: a[0]))
        clock = self._clock_s
        while pending or self.running or self.waiting:
            if not self.running and not self.waiting:
                clock = max(clock, pending[0][0])
            while pending and pending[0][0] <= clock:
                t, req = pending.popleft()
                self._enqueue(req, t)
            plan = self._schedule()
            if plan is None:
                raise RuntimeError("run_virtual: requests left that no step can schedule")
            duration_s = plan.duration_s * self.faults.slow_factor
            clock += duration_s
            self._clock_s = clock
            self._step_extra_energy_j += (plan.power_w - self.timer.idle_power_w) * duration_s
            self._complete(plan)
            self.steps += 1

    def abort(self, req: EngineRequest, reason: str = "client disconnected") -> None:
        """Drop a request (client went away): free its blocks now, count it as aborted."""
        if req.finished:
            return
        if req.running:
            self._release(req)
            self.running.remove(req)
        else:
            try:
                self.waiting.remove(req)
            except ValueError:
                try:
                    self._held.remove(req)
                except ValueError:
                    pass
        req.finished = True
        req.finish_reason = "abort"
        req.error = reason
        self.metrics.request_success["abort"] = self.metrics.request_success.get("abort", 0) + 1
        self._update_gauges()
        req.wake()

    def abort_all(self, reason: str) -> None:
        """Drop every request (engine crash or stop); the prefix cache is lost with the engine."""
        for req in [*self.running, *self.waiting, *self._held]:
            self.abort(req, reason)
        self.pool.reset()
        self._update_gauges()

    # -- sleep mode (sleep_mode.py) -------------------------------------------------------------
    async def sleep(self, level: int, mode: str, duration_s: float) -> None:
        """Put the engine to sleep as vLLM does: hold new requests, deal with the held ones by ``mode`` (abort,
        wait for them, or keep them for after the wake-up), pause the scheduler, empty the KV cache and the prefix
        cache, then take ``duration_s`` engine seconds (the weights offloaded) at the transfer power. Asleep already:
        nothing changes."""
        if level not in SLEEP_LEVELS:
            raise ValueError(f"level: must be one of {SLEEP_LEVELS}, got {level!r}")
        if mode not in SLEEP_MODES:
            raise ValueError(f"mode: must be one of {', '.join(SLEEP_MODES)}, got {mode!r}")
        assert self._sleep_lock is not None and self._emptied is not None and self._work is not None
        async with self._sleep_lock:
            if self.sleep_level:
                return
            self._hold_new = True
            if mode == "abort":
                for req in [*self.running, *self.waiting]:
                    self.abort(req, "the engine was put to sleep (mode abort)")
            elif mode == "wait":
                while self.running or self.waiting:
                    self._emptied.clear()
                    await self._emptied.wait()
            else:  # keep: frozen; their KV cache is discarded, so they are recomputed once awake
                while self.running:
                    req = self.running.pop()
                    self._release(req)
                    req.num_computed_tokens = 0
                    req.prefill_target = req.prompt_tokens + req.num_output_tokens
                    self.waiting.appendleft(req)
            self._paused = True
            self._work.set()  # the loop sees the pause and idles
            self.pool.reset()
            self._update_gauges()
            await self._transfer(duration_s)
            self.sleep_level = level
            self.metrics.sleep_level = level

    async def wake_up(self, duration_s: float) -> None:
        """Wake the engine: ``duration_s`` engine seconds at the transfer power (the weights back), then the
        scheduler runs again with the requests held meanwhile. Awake already: nothing changes."""
        assert self._sleep_lock is not None and self._work is not None
        async with self._sleep_lock:
            if not self.sleep_level:
                return
            await self._transfer(duration_s)
            # the engine slept in engine time too: the clock catches up with wall time, so requests held meanwhile
            # are not stamped as served from their arrival
            if self._idle:
                self._sync_clock(asyncio.get_running_loop().time())
            self.sleep_level = 0
            self.metrics.sleep_level = 0
            self._paused = self._hold_new = False
            self.waiting.extend(self._held)
            self._held.clear()
            self._update_gauges()
            self._work.set()

    async def is_sleeping(self) -> bool:
        """Whether the engine sleeps; asked during a sleep or a wake-up, answers once it is over (as vLLM's engine
        core, which runs its utility calls one after another)."""
        assert self._sleep_lock is not None
        async with self._sleep_lock:
            return self.sleep_level > 0

    async def _transfer(self, duration_s: float) -> None:
        """The weights move over the host link for ``duration_s`` engine seconds, at ``transfer_power_w``."""
        self._transferring = True
        self.metrics.engine_power_w = self.transfer_power_w
        try:
            await asyncio.sleep(max(0.0, duration_s) / self.time_scale)
        finally:
            self._transferring = False
            self.metrics.engine_power_w = self.timer.idle_power_w
        self._step_extra_energy_j += (self.transfer_power_w - self.timer.idle_power_w) * max(0.0, duration_s)

    def set_hang(self, hang: bool) -> None:
        """Pause (hang) or resume the step loop."""
        if self._resume is None:
            return
        if hang:
            self._resume.clear()
        else:
            self._resume.set()

    # -- the loop ---------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._work is not None and self._resume is not None
        deadline = loop.time()
        while True:
            if not self._resume.is_set():
                self._go_idle()
                await self._resume.wait()
                # the hang lasted in engine time too: the clock catches up with wall time
                self._sync_clock(loop.time())
                self._idle = False
                deadline = loop.time()
                continue
            if self._paused:  # asleep or going to sleep: no step runs until wake_up
                self._work.clear()
                self._go_idle()
                await self._work.wait()
                continue
            if not self.running and not self.waiting:
                self._work.clear()
                self._go_idle()
                await self._work.wait()
                continue
            if self._idle:
                # leaving idle: the engine starts when the first request arrived; the host's wake-up
                # latency (which time_scale would magnify) is not engine time, and the step's wall-clock
                # deadline counts from the arrival too, so a client does not wait for it either
                now_wall = loop.time()
                first = self.waiting[0] if self.waiting else None
                start_wall = now_wall
                if first is not None and first.arrival_s >= self._clock_s:
                    self._clock_s = first.arrival_s
                    if first._arrival_wall is not None:
                        start_wall = min(now_wall, first._arrival_wall)
                self._clock_wall = start_wall
                self._idle = False
                deadline = start_wall
            plan = self._schedule()
            if plan is None:  # nothing schedulable (cannot happen with validated requests): wait for change
                self._work.clear()
                await self._work.wait()
                continue
            duration_s = plan.duration_s * self.faults.slow_factor
            self._step_in_flight_s = duration_s
            self.metrics.engine_power_w = plan.power_w
            deadline += duration_s / self.time_scale
            delay = deadline - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)
                if delay < -MAX_LAG_S:
                    deadline = loop.time()
            if not self._resume.is_set():
                # hung mid-step: the step's results are held back until the hang clears
                await self._resume.wait()
            self._clock_s += duration_s
            self._step_extra_energy_j += (plan.power_w - self.timer.idle_power_w) * duration_s
            # the modelled step ended at its deadline, not when the host got round to waking up: the clock counts
            # on from there, so a request that arrives after a late wake-up is stamped when it arrived (not up to
            # the lateness earlier, which the client would see as TTFT the engine did not record); a hang or a
            # lag past MAX_LAG_S is not engine time
            now_wall = loop.time()
            self._clock_wall = deadline if now_wall - deadline < MAX_LAG_S else now_wall
            self._step_in_flight_s = 0.0
            self._complete(plan)
            self.steps += 1

    def _go_idle(self) -> None:
        # the clock already counts on from the end of the last step (set when it completed)
        self._idle = True
        self.metrics.engine_power_w = self.transfer_power_w if self._transferring else self.timer.idle_power_w

    def _sync_clock(self, wall: float) -> None:
        self._clock_s += max(0.0, wall - self._clock_wall) * self.time_scale
        self._clock_wall = wall

    # -- scheduling -------------------------------------------------------------------------
    def _release(self, req: EngineRequest) -> None:
        self.pool.release(req.held_hashes, req.fresh_blocks)
        req.held_hashes = []
        req.fresh_blocks = 0
        req.running = False

    def _preempt_tail(self) -> EngineRequest:
        """Recompute preemption of the most recently admitted request: free its blocks, put it back
        at the head of the queue (it will prefill its prompt and generated tokens again)."""
        req = self.running.pop()
        self._release(req)
        req.num_computed_tokens = 0
        req.prefill_target = req.prompt_tokens + req.num_output_tokens
        self.waiting.appendleft(req)
        self.metrics.num_preemptions += 1
        return req

    def _grow(self, req: EngineRequest, total_tokens: int) -> bool:
        """Make ``req`` hold blocks for ``total_tokens``; preempt from the tail of ``running`` if needed.

        The scheduler walks ``running`` from the head, so the tail (the most recently admitted, as
        in vLLM) is never a request already scheduled this step. Returns False when ``req`` itself
        was the tail and got preempted.
        """
        bs = self.shape.block_size_tokens
        need = blocks_for_tokens(total_tokens, bs) - len(req.held_hashes) - req.fresh_blocks
        if need <= 0:
            return True
        pool = self.pool
        while pool.free_block_count() < need:
            if self._preempt_tail() is req:
                return False
        pool.take_new(need)
        req.fresh_blocks += need
        return True

    def _schedule(self) -> _StepPlan | None:
        budget = self.shape.max_num_batched_tokens
        preemptions_before = self.metrics.num_preemptions
        prefill: list[tuple[EngineRequest, int]] = []
        decode: list[EngineRequest] = []
        decode_context = 0
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if req.num_computed_tokens < req.prefill_target:
                n = min(budget, req.prefill_target - req.num_computed_tokens)
                if not self._grow(req, req.num_computed_tokens + n):
                    break  # req was the tail and got preempted: nothing after it is left to schedule
                prefill.append((req, n))
                budget -= n
            else:
                context = req.prompt_tokens + req.num_output_tokens
                if not self._grow(req, context + 1):
                    break
                decode.append(req)
                decode_context += context
                budget -= 1
            i += 1
        if self.metrics.num_preemptions == preemptions_before:  # vLLM admits nothing in a step that preempted
            self._admit(prefill, budget)
        self._update_gauges()
        if not prefill and not decode:
            return None
        duration, power_w = self.timer.step([(n, r.num_computed_tokens) for r, n in prefill], len(decode), decode_context)
        return _StepPlan(prefill, decode, duration, power_w)

    def _admit(self, prefill: list[tuple[EngineRequest, int]], budget: int) -> None:
        bs = self.shape.block_size_tokens
        pool, m = self.pool, self.metrics
        now = self._clock_s  # a step is being planned: the clock stands at the end of the previous one
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            target = req.prefill_target
            # when the whole prompt is cached the last token is still computed to get logits (vLLM)
            hit_blocks = pool.cached_prefix_blocks(req.block_hashes, (target - 1) // bs)
            hit_hashes = req.block_hashes[:hit_blocks]
            hit_tokens = hit_blocks * bs
            n = min(budget, target - hit_tokens)
            new_blocks = blocks_for_tokens(hit_tokens + n, bs) - hit_blocks
            if not pool.can_allocate(hit_hashes, new_blocks):
                break
            pool.hold_cached(hit_hashes)
            pool.take_new(new_blocks)
            self.waiting.popleft()
            req.held_hashes = list(hit_hashes)
            req.fresh_blocks = new_blocks
            req.num_computed_tokens = hit_tokens
            req.running = True
            self.running.append(req)
            m.prefix_cache_queries_tokens += target
            m.prefix_cache_hits_tokens += hit_tokens
            if not req.admitted_once:
                req.admitted_once = True
                req.num_cached_tokens = hit_tokens
                req.scheduled_s = now
                m.queue_time.observe(now - req.arrival_s)
            prefill.append((req, n))
            budget -= n

    def _update_gauges(self) -> None:
        m = self.metrics
        m.num_requests_running = len(self.running)
        m.num_requests_waiting = len(self.waiting) + len(self._held)
        m.kv_cache_usage_perc = self.pool.usage
        if self._emptied is not None and not self.running and not self.waiting:
            self._emptied.set()

    # -- applying a step ----------------------------------------------------------------------
    def _complete(self, plan: _StepPlan) -> None:
        now = self._clock_s
        bs = self.shape.block_size_tokens
        pool = self.pool
        producing: list[EngineRequest] = []
        for req, n in plan.prefill:
            if req.finished or not req.running:
                continue
            req.num_computed_tokens += n
            # publish the prompt blocks this chunk completed so later prompts can reuse them
            full = min(req.num_computed_tokens // bs, len(req.block_hashes))
            while len(req.held_hashes) < full:
                pool.publish(req.block_hashes[len(req.held_hashes)])
                req.held_hashes.append(req.block_hashes[len(req.held_hashes)])
                req.fresh_blocks -= 1
            if req.num_computed_tokens >= req.prefill_target:
                producing.append(req)
        # decode tokens of one step all share the same inter-token latency unless a request was
        # preempted in between; group them to observe the histogram once per distinct value
        itl_groups: dict[float, int] = {}
        m = self.metrics
        for req in plan.decode:
            if req.finished or not req.running:
                continue
            itl = now - req.last_token_s
            itl_groups[itl] = itl_groups.get(itl, 0) + 1
            self._emit_token(req, now)
        for itl, count in itl_groups.items():
            m.itl.observe_many(itl, count)
        for req in producing:
            if req.first_token_s is None:
                req.first_token_s = now
                m.ttft.observe(now - req.arrival_s)
                m.prompt_tokens += req.prompt_tokens
            else:  # resumed after a preemption
                m.itl.observe(now - req.last_token_s)
            self._emit_token(req, now)
        if any(r.finished for r in self.running):
            self.running = [r for r in self.running if not r.finished]
        self._update_gauges()

    def _emit_token(self, req: EngineRequest, now: float) -> None:
        """One generated token for ``req``; finish it on length, stop string or pseudo-EOS."""
        req.num_output_tokens += 1
        req.last_token_s = now
        self.metrics.generation_tokens += 1
        k = req.num_output_tokens
        reason: str | None = None
        if k >= req.min_tokens:
            if req.stop:
                self._check_stop(req)
                if req.stop_reason is not None:
                    reason = "stop"
            if reason is None and req._eos_rng is not None and req._eos_rng.random() < req.eos_probability:
                reason = "stop"
        if reason is None and k >= req.max_tokens:
            reason = "length"
        if reason is not None:
            self._finish(req, reason, now)
        req.wake()

    def _check_stop(self, req: EngineRequest) -> None:
        """Look for a stop string that ends inside the newest token (earlier ones were checked before)."""
        longest = max(len(s) for s in req.stop)
        k = req.num_output_tokens
        first = max(0, k - 1 - longest)  # every filler token has >= 1 character
        base = filler_offset(first)
        window = filler_text(first, k - first)
        newest_start = filler_offset(k - 1) - base
        best: tuple[int, str] | None = None
        for s in req.stop:
            pos = window.find(s, max(0, newest_start - len(s) + 1))
            if pos >= 0 and (best is None or pos < best[0]):
                best = (pos, s)
        if best is not None:
            req.text_limit_chars = base + best[0]
            req.stop_reason = best[1]

    def _finish(self, req: EngineRequest, reason: str, now: float) -> None:
        req.finished = True
        req.finish_reason = reason
        self._release(req)
        m = self.metrics
        m.e2e.observe(now - req.arrival_s)
        # vLLM's per-request TPOT (v1/metrics/stats.py): first to last token over the tokens after the first, i.e.
        # (e2e - TTFT) / (tokens - 1); vLLM observes 0 for a one-token request, and so does the emulator
        n = req.num_output_tokens
        first_token_s = now if req.first_token_s is None else req.first_token_s
        m.request_tpot.observe((now - first_token_s) / (n - 1) if n > 1 else 0.0)
        m.request_success[reason] = m.request_success.get(reason, 0) + 1
