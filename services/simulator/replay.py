"""Discrete-event trace replay of an LLM serving fleet in virtual time.

``replay(workload, fleet)`` runs a ``Workload`` through a fleet (``replay_fleet.FleetConfig``: engines, a
routing policy from replay_routing.py, an optional autoscaler and, for prefill/decode disaggregation, a
KV-transfer link) and returns a ``replay_result.ReplayResult``. This module holds the event loop: arrivals,
routing, each engine's batch scheduling, PD transfers and autoscaling; an engine's state and decode-run timing
are replay_engine.py's.

How an engine is simulated (vLLM V1 continuous batching with chunked prefill):

* A **mixed step** runs whenever requests wait: FCFS from the queue head, each request is admitted if its
  KV reservation (prompt + output, rounded up to blocks) fits the block pool and ``max_num_seqs`` allows,
  its cached prefix is looked up (HBM, then DRAM, then disk) and the read-or-recompute rule of
  ``PerfModel.plan_prefix_reuse`` decides which tiers to reload (Kareto Sec. 3.3, StoreLLM Sec. 3.4); then up
  to ``max_num_batched_tokens`` prefill tokens (minus one per decoding sequence) are computed in the step,
  together with one decode token for every running sequence.
* Between batch-composition changes the engine is in a **decode run** to the next completion, one event
  (``ReplayEngine.run_time``). A request routed to an engine in a decode run cuts the run at the end of the
  step in progress.

Energy: a step's energy is ``power_w(utilisation) x duration``; it is shared by the step's tokens (a
decoding sequence counts one token, a prefill chunk its tokens). Idle engines draw idle power, switched-off
(autoscaled) engines nothing.

Simplifications (documented in docs/simulator.md): the full KV reservation is taken at admission (vLLM
allocates on demand and preempts; here nothing is preempted); a decode run's energy uses the utilisation
at its middle context; prefix caching is at the trace's hash-block granularity; LMCache tiers are
write-through at prefill completion and evict by LRU, FIFO or LCS (tiers.py); generated tokens are not cached (LMCache
``save_decode_cache`` default false).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence

from greenserve.simulator.replay_engine import ReplayEngine
from greenserve.simulator.replay_fleet import FleetConfig
from greenserve.simulator.replay_result import ReplayResult, finish_replay
from greenserve.simulator.replay_routing import make_policy
from greenserve.simulator.workloads import Workload

__all__ = ["replay"]

INF = math.inf
_EV_STEP, _EV_TRANSFER, _EV_AUTOSCALE, _EV_READY = 0, 1, 2, 3


class _Sim:
    """One replay run (use ``replay``); exposed to routing policies as ``sim`` (``engines``, ``hashes``)."""

    def __init__(self, workload: Workload, fleet: FleetConfig) -> None:
        self.w = workload
        self.fleet = fleet
        self.hashes = workload.block_hashes
        n_eng = len(fleet.engines)
        initial = n_eng
        if fleet.autoscale is not None:
            initial = fleet.autoscale.initial_engines or fleet.autoscale.min_engines
            initial = max(fleet.autoscale.min_engines, min(initial, n_eng))
        self.engines = [ReplayEngine(i, spec, workload.hash_block_tokens, i < initial) for i, spec in enumerate(fleet.engines)]
        self.policy = make_policy(fleet.policy, fleet.seed)
        self.disagg = any(e.role != "both" for e in self.engines)
        n = len(workload)
        self.n = n
        self.arrival = workload.arrival_s
        self.prompt = workload.prompt_tokens
        self.output = workload.output_tokens
        nan = math.nan
        self.t_first = [nan] * n
        self.t_finish = [nan] * n
        self.t_admit = [nan] * n
        self.eng_of = [-1] * n
        self.done = [0] * n
        self.need = [0] * n
        self.s_start = [0] * n
        self.a_start = [0.0] * n
        self.energy = [0.0] * n
        self.hit_h = [0] * n
        self.hit_d = [0] * n
        self.hit_k = [0] * n
        self.skipped = [0] * n
        self.recomputed = [0] * n
        self.xfer = [0.0] * n
        self.admitted = [False] * n
        self.pd_ready = [False] * n
        self.rejected = [False] * n
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.events = 0
        self.now = 0.0
        self.link_free = 0.0
        self.kv_bytes = [e.pm._kv_bytes_per_token for e in self.engines]

    # -- event plumbing -------------------------------------------------------------------------------
    def push(self, t: float, kind: int, a: int, b: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, a, b))

    def run(self) -> None:
        heap = self.heap
        arrival = self.arrival
        n = self.n
        i = 0
        auto = self.fleet.autoscale
        if auto is not None and n:
            self.push(arrival[0] + auto.interval_s, _EV_AUTOSCALE, 0, 0)
        pop = heapq.heappop
        while True:
            t_arr = arrival[i] if i < n else INF
            if heap and heap[0][0] <= t_arr:
                t, _, kind, a, b = pop(heap)
                self.now = t
                self.events += 1
                if kind == _EV_STEP:
                    eng = self.engines[a]
                    if b == eng.version:
                        self.step_end(eng, t)
                elif kind == _EV_TRANSFER:
                    self.deliver_prefilled(b, t)
                elif kind == _EV_AUTOSCALE:
                    self.autoscale(t)
                    if i < n or any(e.outstanding for e in self.engines):
                        self.push(t + auto.interval_s, _EV_AUTOSCALE, 0, 0)  # type: ignore[union-attr]
                elif kind == _EV_READY:
                    eng = self.engines[a]
                    if eng.on:
                        eng.routable = True
            elif i < n:
                self.now = t_arr
                self.events += 1
                self.route(i, t_arr)
                i += 1
            else:
                break

    # -- arrivals and routing -------------------------------------------------------------------------
    def candidates(self, role: str) -> list[int]:
        c = [e.idx for e in self.engines if e.routable and (e.role == "both" or e.role == role)]
        if not c:  # every engine draining: use any engine that is on
            c = [e.idx for e in self.engines if e.on and (e.role == "both" or e.role == role)]
        if not c:
            c = [e.idx for e in self.engines if e.role == "both" or e.role == role]
        return c

    def route(self, r: int, now: float) -> None:
        cands = self.candidates("prefill")
        e = self.policy.choose(self, r, cands) if len(cands) > 1 else cands[0]
        self.enqueue(self.engines[e], r, now)

    def enqueue(self, eng: ReplayEngine, r: int, now: float) -> None:
        self.eng_of[r] = eng.idx
        eng.waiting.append(r)
        eng.outstanding += 1
        if not eng.on:
            eng.on = True
            eng.idle_since = now
        if eng.state == 0:
            eng.energy_idle_j += eng.idle_w * (now - eng.idle_since)
            self.schedule(eng, now)
        elif eng.state == 2:
            self.cut_run(eng, now)

    def cut_run(self, eng: ReplayEngine, now: float) -> None:
        """End the current decode run at the end of the step in progress at ``now``."""
        elapsed = now - eng.run_t0
        n = eng.run_n
        if n <= 1:
            return
        B, C0 = eng.B, eng.run_c0
        lo, hi = 1, n
        while lo < hi:
            mid = (lo + hi) >> 1
            if eng.run_time(mid, C0, B) >= elapsed:
                hi = mid
            else:
                lo = mid + 1
        if lo < n:
            eng.run_n = lo
            eng.run_end = eng.run_t0 + eng.run_time(lo, C0, B)
            eng.version += 1
            self.push(eng.run_end, _EV_STEP, eng.idx, eng.version)

    # -- scheduling -----------------------------------------------------------------------------------
    def schedule(self, eng: ReplayEngine, now: float) -> None:
        """Start the engine's next step (mixed prefill step, decode run) or make it idle."""
        waiting = eng.waiting
        B = eng.B
        if waiting:
            budget = eng.max_batched - B
            planned: list[tuple[int, int]] = []
            flops = 0.0
            prefill_ctx = 0
            extra = 0.0
            seqs = B + eng.n_prefilling
            prompt, output, done = self.prompt, self.output, self.done
            rejected_now: list[int] = []
            joined = False
            pm = eng.pm
            for r in waiting:
                if not self.admitted[r]:
                    need = -(-(prompt[r] + output[r]) // eng.block) * eng.block
                    if need > eng.cap_tokens:
                        rejected_now.append(r)
                        continue
                    if eng.reserved + need > eng.cap_tokens or seqs >= eng.max_seqs:
                        break
                    self.admit(eng, r, need, now)
                    seqs += 1
                    if self.pd_ready[r]:
                        joined = True
                        continue
                    extra += self.step_extra_tmp
                elif self.pd_ready[r]:
                    continue
                if budget <= 0:
                    break
                remaining = prompt[r] - done[r]
                chunk = min(budget, remaining)
                flops += pm.prefill_flops(chunk, 1, done[r])
                prefill_ctx += done[r]
                planned.append((r, chunk))
                budget -= chunk
                if chunk < remaining:
                    break
            for r in rejected_now:
                waiting.remove(r)
                self.rejected[r] = True
                eng.outstanding -= 1
            if joined:
                # pre-filled (PD) requests joined the decode batch directly; drop them from the queue
                for r in [r for r in waiting if self.pd_ready[r] and self.admitted[r]]:
                    waiting.remove(r)
                B = eng.B
            if planned:
                eng.planned = planned
                tok = sum(c for _, c in planned)
                # one forward pass over the chunks and the decode batch: the performance model's step cost
                mem_s, comp_s = pm.step_parts_s(flops, prefill_ctx, B, eng.base_sum + B * eng.S)
                dt = eng.o + max(comp_s, mem_s) + extra
                u = pm.step_utilisation(mem_s, comp_s)
                energy = (eng.idle_w + eng.span_w * u) * dt
                eng.energy_active_j += energy
                share = energy / (tok + B)
                en = self.energy
                for r, c in planned:
                    en[r] += share * c
                if B:
                    eng.A += share
                    eng.decoded_tokens += B
                eng.prefilled_tokens += tok
                eng.busy_s += dt
                eng.steps += 1
                eng.batch_time_sum += (B + len(planned)) * dt
                eng.state = 1
                eng.version += 1
                self.push(now + dt, _EV_STEP, eng.idx, eng.version)
                return
        if B:
            n = eng.fin_heap[0][0] - eng.S
            n = max(n, 1)
            C0 = eng.base_sum + B * eng.S
            eng.run_t0 = now
            eng.run_n = n
            eng.run_c0 = C0
            eng.run_end = now + eng.run_time(n, C0, B)
            eng.state = 2
            eng.version += 1
            self.push(eng.run_end, _EV_STEP, eng.idx, eng.version)
            return
        eng.state = 0
        eng.idle_since = now
        eng.planned = []

    step_extra_tmp = 0.0

    def admit(self, eng: ReplayEngine, r: int, need: int, now: float) -> None:
        """Reserve KV, look the prefix up in the tiers and apply the read-or-recompute rule."""
        self.admitted[r] = True
        self.need[r] = need
        eng.reserved += need
        self.t_admit[r] = now
        self.step_extra_tmp = 0.0
        if self.pd_ready[r]:
            # KV arrived over the link: join the decode batch at the current step
            self.join_decode(eng, r)
            return
        eng.n_prefilling += 1
        hashes = self.hashes[r] if self.hashes else ()
        if not hashes:
            return
        ht = eng.hash_tokens
        nh, nd, nk = eng.lookup(hashes, now)
        p = self.prompt[r]
        cap = p - 1  # the last prompt token is always computed
        h_tok = min(nh * ht, cap)
        d_tok = min(nd * ht, cap - h_tok)
        k_tok = min(nk * ht, cap - h_tok - d_tok)
        if d_tok or k_tok:
            plan = eng.pm.plan_prefix_reuse(h_tok, d_tok, k_tok, p, now - self.arrival[r], eng.reuse_rule,
                                            eng.reuse_budget)
            d_tok, k_tok = plan.used_dram_tokens, plan.used_disk_tokens
            self.skipped[r] = plan.skipped_tokens
            self.step_extra_tmp = plan.load_s
        self.hit_h[r], self.hit_d[r], self.hit_k[r] = h_tok, d_tok, k_tok
        self.done[r] = h_tok + d_tok + k_tok

    def join_decode(self, eng: ReplayEngine, r: int) -> None:
        S = eng.S
        self.s_start[r] = S
        self.a_start[r] = eng.A
        eng.base_sum += self.prompt[r] + 1 - S
        eng.B += 1
        heapq.heappush(eng.fin_heap, (S + self.output[r] - 1, r))

    def finish(self, eng: ReplayEngine, r: int, now: float) -> None:
        self.t_finish[r] = now
        self.energy[r] += eng.A - self.a_start[r]
        eng.reserved -= self.need[r]
        eng.B -= 1
        eng.base_sum -= self.prompt[r] + 1 - self.s_start[r]
        eng.outstanding -= 1

    def step_end(self, eng: ReplayEngine, now: float) -> None:
        if eng.state == 2:
            n, B = eng.run_n, eng.B
            dt = now - eng.run_t0
            u = eng.utilisation_at(B, eng.run_c0 + B * n * 0.5)
            if eng.draft_span_w and eng.spec is not None:  # DSD: each GPU busy for its own share of the rounds
                draft_s, verify_s, link_s = eng.pm.spec_decode_round_parts_s(
                    eng.spec, B, int(eng.run_c0 + B * n * 0.5))
                rnd = draft_s + verify_s + link_s
                energy = (eng.idle_w + (eng.span_w * u * verify_s + eng.draft_span_w * eng.draft_mem_w * draft_s)
                          / rnd) * dt
            else:
                energy = (eng.idle_w + eng.span_w * u) * dt
            eng.energy_active_j += energy
            eng.A += energy / B
            eng.S += n
            eng.decoded_tokens += B * n
            eng.busy_s += dt
            eng.steps += n
            eng.batch_time_sum += B * dt
        else:
            if eng.B:
                eng.S += 1
        S = eng.S
        fh = eng.fin_heap
        while fh and fh[0][0] <= S:
            _, r = heapq.heappop(fh)
            self.finish(eng, r, now)
        if eng.state == 1:
            waiting = eng.waiting
            done, prompt, output = self.done, self.prompt, self.output
            for r, c in eng.planned:
                done[r] += c
                if done[r] >= prompt[r]:
                    if waiting and waiting[0] == r:
                        waiting.popleft()
                    else:
                        waiting.remove(r)
                    eng.n_prefilling -= 1
                    self.recomputed[r] = prompt[r] - self.hit_h[r] - self.hit_d[r] - self.hit_k[r]
                    self.t_first[r] = now
                    if self.hashes:
                        h = self.hashes[r]
                        if h:
                            eng.store(h, now)
                    if eng.role == "prefill":
                        eng.reserved -= self.need[r]
                        eng.outstanding -= 1
                        self.start_transfer(eng, r, now)
                    elif output[r] <= 1:
                        self.t_finish[r] = now
                        eng.reserved -= self.need[r]
                        eng.outstanding -= 1
                    else:
                        self.join_decode(eng, r)
            eng.planned = []
        self.schedule(eng, now)

    # -- disaggregation -------------------------------------------------------------------------------
    def start_transfer(self, eng: ReplayEngine, r: int, now: float) -> None:
        nbytes = self.prompt[r] * self.kv_bytes[eng.idx]
        start = max(self.link_free, now)
        dur = self.fleet.kv_link_latency_s + nbytes / self.fleet.kv_link_bandwidth_bytes_per_s
        self.link_free = start + dur
        self.xfer[r] = start + dur - now
        self.push(start + dur, _EV_TRANSFER, eng.idx, r)

    def deliver_prefilled(self, r: int, now: float) -> None:
        self.pd_ready[r] = True
        self.admitted[r] = False
        cands = self.candidates("decode")
        engines = self.engines
        e = min(cands, key=lambda j: (engines[j].outstanding, j))
        self.enqueue(engines[e], r, now)

    # -- autoscaling ----------------------------------------------------------------------------------
    def autoscale(self, now: float) -> None:
        auto = self.fleet.autoscale
        assert auto is not None
        active = [e for e in self.engines if e.routable]
        load = sum(e.outstanding for e in active) / max(len(active), 1)
        if load > auto.scale_up_outstanding:
            for e in self.engines:
                if not e.on:
                    e.on = True
                    e.idle_since = now + auto.cold_start_s
                    e.state = 0
                    self.push(now + auto.cold_start_s, _EV_READY, e.idx, 0)
                    return
        elif load < auto.scale_down_outstanding and len(active) > auto.min_engines:
            victim = active[-1]
            victim.routable = False
        for e in self.engines:  # drained engines switch off
            if e.on and not e.routable and e.outstanding == 0 and e.state == 0:
                e.energy_idle_j += e.idle_w * max(0.0, now - e.idle_since)
                e.on = False


def replay(workload: Workload, fleet: FleetConfig,
           initial_contents: Sequence[Mapping[str, Sequence[int]]] | None = None) -> ReplayResult:
    """Replay ``workload`` through ``fleet`` in virtual time; deterministic for the fleet's seed.

    ``initial_contents``: one mapping per engine of the prefix-cache blocks it holds at the start (as a previous
    result's ``tier_contents``; the block ids must be the workload's), so that state carries from one replay to
    the next; an engine's tiers keep what their capacities hold (``PrefixTiers.preload``)."""
    if not isinstance(workload, Workload):
        raise TypeError("workload: must be a Workload")
    if not isinstance(fleet, FleetConfig):
        raise TypeError("fleet: must be a FleetConfig")
    sim = _Sim(workload, fleet)
    if initial_contents is not None:
        if len(initial_contents) != len(sim.engines):
            raise ValueError(f"initial_contents: one mapping per engine ({len(sim.engines)}), "
                             f"got {len(initial_contents)}")
        start = float(workload.arrival_s[0]) if len(workload) else 0.0
        for eng, contents in zip(sim.engines, initial_contents):
            eng.tiers.preload(contents, eng.hbm_cap_blocks if eng.prefix_caching else None, start)
    sim.run()
    return finish_replay(sim)
