"""The `hf` engine: transformers on CPU or one GPU, the embedded default for demos, tests and small trace runs.

The same phases as the vLLM engine, done by hand in one decoding loop: THINK (T=0.6, top-p, top-k) until `</think>`
or the cap; at the cap the forced-close sentence and `</think>` are fed as if sampled; then the answer grammar
(submission.reasoning.reply_grammar, compiled by xgrammar) masks every answer token, sampled at the answer temperature,
until the grammar accepts end of turn or the answer limit. Requests are decoded together in static batches of up to
`max_num_seqs` (a batch runs until its last member ends; new requests wait for the next batch): simple, and enough
for tiny models. Generation runs in one worker thread; the async API only hands requests over.

A request's seed drives its own sampler, so the same batch gives the same samples. On the CPU (float32) a request
also gives the same sample whatever else shares its batch; on a GPU in bfloat16 it need not: the batch's shape and
padding change the kernels' rounding of the logits, and a sample can part from there, as in any batched GPU engine.

Against the `vllm` engine (engines/vllm.py has the list): an abort is seen at the batch's next step, and a
request still queued for a later batch returns "aborted" only when that batch starts, so the solver never waits on
it past a short grace; "length" means the answer limit here; a forced completion has exactly `cap` thinking tokens
on both engines.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from submission.reasoning.reply_grammar import THINK_END, Reply, answer_grammar, banned_answer_ids, forced_end
from submission.reasoning.profile import EngineConfig
from submission.reasoning.engines.base import Completion, EngineDead, GenerationRequest, ThroughputMeter

THINK, FORCE, ANSWER, DONE = "think", "force", "answer", "done"


@dataclass
class _Sequence:
    request: GenerationRequest
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    generator: object
    started: float
    phase: str = THINK
    tokens: list[int] = field(default_factory=list)
    forced: list[int] = field(default_factory=list)
    thinking: int = 0
    answer: int = 0
    natural: bool = False
    finish: str = ""
    matcher: object = None


class HFEngine:
    def __init__(self, model_dir: str | Path, config: EngineConfig):
        self.model_dir = Path(model_dir)
        self.config = config
        self.meter = ThroughputMeter(config.stats_window_s)
        self._pending: queue.Queue = queue.Queue()
        self._aborted: set[str] = set()
        self._thread: threading.Thread | None = None
        self._closing = False

    async def start(self) -> None:
        await asyncio.to_thread(self._load)
        self._thread = threading.Thread(target=self._worker, name="hf-engine", daemon=True)
        self._thread.start()

    def _load(self) -> None:
        import torch
        import xgrammar as xgr
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.xgr = xgr
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = getattr(torch, self.config.dtype) if self.device == "cuda" else torch.float32
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=dtype).to(self.device).eval()
        vocab = self.model.config.vocab_size
        info = xgr.TokenizerInfo.from_huggingface(self.tokenizer, vocab_size=vocab)
        compiler = xgr.GrammarCompiler(info)
        self.grammars = {reply: compiler.compile_grammar(
            answer_grammar(self.config.program_cue, self.config.program_max_chars, reply)) for reply in Reply}
        self.vocab = vocab
        self.think_end = self.tokenizer.convert_tokens_to_ids(THINK_END)
        self.eos = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos
        self.forced_ids = self.tokenizer.encode(forced_end(self.config.forced_close), add_special_tokens=False)
        self.banned = banned_answer_ids(self.tokenizer)
        stop = self.model.generation_config.eos_token_id
        self.stop_ids = set(stop if isinstance(stop, list) else [stop]) | {self.eos}

    async def generate(self, request: GenerationRequest) -> Completion:
        if self._thread is None or not self._thread.is_alive():
            raise EngineDead("the hf engine's worker thread is not running")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.put((request, future, loop, time.monotonic()))
        return await future

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)

    async def close(self) -> None:
        self._closing = True
        self._pending.put(None)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30)

    # --- the worker thread -------------------------------------------------------------------------------------

    def _worker(self) -> None:
        while not self._closing:
            item = self._pending.get()
            if item is None:
                break
            batch = [item]
            while len(batch) < self.config.max_num_seqs:
                try:
                    nxt = self._pending.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._closing = True
                    break
                batch.append(nxt)
            sequences = []
            for request, future, loop, started in batch:
                gen = self.torch.Generator().manual_seed(request.seed)
                sequences.append(_Sequence(request, future, loop, gen, started))
            try:
                self._run_batch(sequences)
            except Exception as err:  # noqa: BLE001 - an engine failure ends this batch's requests, not the engine
                for seq in sequences:
                    if seq.phase != DONE:
                        seq.phase, seq.finish = DONE, f"error: {type(err).__name__}: {err}"
                        self._resolve(seq)

    def _sample(self, logits, temperature: float, generator) -> int:
        torch = self.torch
        logits = logits.float() / max(temperature, 1e-5)
        if self.config.top_k > 0:
            kth = torch.topk(logits, min(self.config.top_k, logits.numel())).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.config.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_probs, -1) - sorted_probs < self.config.top_p
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
        return int(torch.multinomial(probs, 1, generator=generator))

    def _next_token(self, seq: _Sequence, logits) -> int:
        if seq.request.request_id in self._aborted:
            seq.phase, seq.finish = DONE, "aborted"
            return self.pad
        if seq.phase == THINK and seq.thinking >= seq.request.thinking_cap - len(self.forced_ids):
            # the forced close counts as thinking: the cap is the whole budget up to </think>
            seq.phase, seq.forced = FORCE, list(self.forced_ids)
        if seq.phase == FORCE:
            token = seq.forced.pop(0)
            seq.thinking += 1
            if token == self.think_end:
                seq.phase = ANSWER
            return token
        if seq.phase == THINK:
            token = self._sample(logits, self.config.temperature, seq.generator)
            seq.thinking += 1
            if token == self.think_end:
                seq.natural, seq.phase = True, ANSWER
            elif token in self.stop_ids:  # end of turn inside thinking ends the request, as in vLLM
                seq.phase, seq.finish = DONE, "stop"
            return token
        # ANSWER: every token under the grammar
        if seq.matcher is None:
            seq.matcher = self.xgr.GrammarMatcher(self.grammars[seq.request.reply])
        token = self._sample_answer(seq, logits)
        if not seq.matcher.accept_token(token):
            seq.phase, seq.finish = DONE, "error: grammar rejected a masked token"  # never loop on it
            return token
        seq.answer += 1
        if seq.matcher.is_terminated():
            seq.phase, seq.finish = DONE, "stop"
        elif seq.answer >= self.config.answer_max_tokens:
            seq.phase, seq.finish = DONE, "length"
        return token

    def _sample_answer(self, seq: _Sequence, logits) -> int:
        mask = self.xgr.allocate_token_bitmask(1, self.vocab)
        seq.matcher.fill_next_token_bitmask(mask)
        masked = logits.unsqueeze(0).clone()
        self.xgr.apply_token_bitmask_inplace(masked, mask)
        masked[0, self.banned] = float("-inf")
        return self._sample(masked[0], self.config.answer_temperature, seq.generator)

    def _run_batch(self, sequences: list[_Sequence]) -> None:
        torch = self.torch
        width = max(len(s.request.prompt_ids) for s in sequences)
        ids = torch.full((len(sequences), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, seq in enumerate(sequences):  # left padding
            prompt = torch.tensor(seq.request.prompt_ids, dtype=torch.long)
            ids[row, width - len(prompt):] = prompt
            mask[row, width - len(prompt):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        self.meter.add(running=len(sequences), prompt_tokens=int(mask.sum()))
        cache = None
        with torch.inference_mode():
            while any(s.phase != DONE for s in sequences):
                out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                                 use_cache=True)
                cache = out.past_key_values
                logits = out.logits[:, -1, :].float().cpu()  # sampled on the CPU with per-request generators
                active = sum(s.phase != DONE for s in sequences)
                step = []
                for row, seq in enumerate(sequences):
                    if seq.phase == DONE:
                        step.append(self.pad)
                        continue
                    token = self._next_token(seq, logits[row])
                    if seq.finish != "aborted":
                        seq.tokens.append(token)
                    step.append(token)
                    if seq.phase == DONE:
                        self._resolve(seq)
                running = sum(s.phase != DONE for s in sequences)
                context = sum(len(s.request.prompt_ids) + len(s.tokens) for s in sequences if s.phase != DONE)
                self.meter.add(tokens=active, running=running, context=context)
                ids = torch.tensor(step, dtype=torch.long, device=self.device).unsqueeze(1)
                mask = torch.cat([mask, torch.ones((len(sequences), 1), dtype=torch.long, device=self.device)], 1)
                positions = positions[:, -1:] + 1

    def _resolve(self, seq: _Sequence) -> None:
        text = self.tokenizer.decode(seq.tokens, skip_special_tokens=False)
        completion = Completion(seq.request.request_id, text, seq.thinking, seq.answer, seq.natural, seq.finish,
                                seq.started, time.monotonic(), tuple(seq.tokens))
        self._aborted.discard(seq.request.request_id)
        seq.loop.call_soon_threadsafe(lambda: seq.future.done() or seq.future.set_result(completion))
