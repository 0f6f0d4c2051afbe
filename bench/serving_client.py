"""The serving-scale bench's users, as an OpenAI-compatible client of `vllm serve`: each user's turns streamed, the
time to the first token and the tokens counted per request, the replicas picked round-robin (no prefix-aware
router). What the users send is `serving_workload`'s. `make demo` runs the same users against its Deployment's pods
(their model is served under another name, hence `model`)."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import aiohttp
from gpu_vllm import SERVED_NAME
from serving_workload import User, Workload, next_prompt, remember_answer, think_seconds, users

Counters = TypeVar("Counters")


async def complete(
    session: aiohttp.ClientSession, base_url: str, prompt: list[int], max_tokens: int, model: str = SERVED_NAME
) -> dict[str, Any]:
    """One streamed completion: seconds to the first token and in all, tokens in and out, the answer's text."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft: float | None = None
    text: list[str] = []
    usage: dict[str, Any] = {}
    async with session.post(f"{base_url}/v1/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"vLLM answered {response.status}: {(await response.text())[:2000]}")
        async for raw in response.content:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices"):
                if ttft is None:
                    ttft = time.perf_counter() - start
                text.append(chunk["choices"][0].get("text", ""))
            if chunk.get("usage"):
                usage = chunk["usage"]
    if ttft is None:
        raise RuntimeError("vLLM closed the stream before the first token")
    return {
        "ttft_s": ttft,
        "seconds": time.perf_counter() - start,
        "prompt_tokens": int(usage.get("prompt_tokens", len(prompt))),
        "output_tokens": int(usage.get("completion_tokens", max_tokens)),
        "text": "".join(text),
    }


class RoundRobin:
    """The next replica for each request, in turn, whoever sends it."""

    def __init__(self, urls: Sequence[str]) -> None:
        self._urls = itertools.cycle(urls)

    def __call__(self) -> str:
        return next(self._urls)


async def prime(
    urls: Sequence[str], workload: Workload, users: Sequence[User], timeout: float, model: str = SERVED_NAME
) -> int:
    """Every user's first turn, all at once, one token each: the documents are computed (and offloaded where the
    side offloads) before the point is measured, as for users who have been talking for a while."""
    route = RoundRobin(urls)
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(timeout=client_timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        answers = await asyncio.gather(*(complete(session, route(), next_prompt(workload, u), 1, model) for u in users))
    for user, answer in zip(users, answers, strict=True):
        remember_answer(user, answer["text"])
    return sum(a["prompt_tokens"] for a in answers)


async def run_users(
    urls: Sequence[str], workload: Workload, users: Sequence[User], seconds: float, model: str = SERVED_NAME
) -> list[dict[str, Any]]:
    """Each user's turns until `seconds` are up (a request still running then is abandoned and not counted);
    the requests that finished, with when they finished."""
    route = RoundRobin(urls)
    loop = asyncio.get_running_loop()
    started = loop.time()
    deadline = started + seconds
    done: list[dict[str, Any]] = []

    async def user_turns(session: aiohttp.ClientSession, user: User) -> None:
        await asyncio.sleep(min(think_seconds(workload, user), max(deadline - loop.time(), 0)))
        while loop.time() < deadline:
            prompt = next_prompt(workload, user)
            try:
                answer = await asyncio.wait_for(
                    complete(session, route(), prompt, workload.answer_tokens, model), deadline - loop.time()
                )
            except TimeoutError:
                return
            remember_answer(user, answer.pop("text"))
            done.append(answer | {"user": user.index, "reuses": user.reuses, "end_s": loop.time() - started})
            await asyncio.sleep(min(think_seconds(workload, user), max(deadline - loop.time(), 0)))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(user_turns(session, u) for u in users))
    return done


async def single(url: str, prompt: list[int], model: str = SERVED_NAME) -> float:
    """TTFT of one request alone (max_tokens 1)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        answer = await complete(session, url, prompt, 1, model)
    return float(answer["ttft_s"])


def measured_users(
    urls: Sequence[str],
    workload: Workload,
    seconds: float,
    prime_timeout: float,
    counters: Callable[[], Counters],
    model: str = SERVED_NAME,
) -> tuple[int, list[dict[str, Any]], Counters, Counters]:
    """A point's users: every document primed, the counters read, `seconds` of users, the counters read again.
    Returns the prompt tokens primed, the requests that finished, and the counters before and after."""
    people = users(workload)
    primed = asyncio.run(prime(urls, workload, people, prime_timeout, model))
    before = counters()
    requests = asyncio.run(run_users(urls, workload, people, seconds, model))
    return primed, requests, before, counters()
