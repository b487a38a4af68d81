r"""An LLM-style voice bot on the voxgate bot contract, written only against ``voxgate_client``.

What a real bot does, with a stand-in for the LLM so it runs anywhere:

* it calls a language model **over the network** (here :class:`StandInLlm`, a tiny HTTP server
  on loopback that streams tokens as server-sent events with a delay between tokens, the way
  hosted LLM APIs stream a completion);
* it **speaks sentence by sentence as the tokens arrive**: each sentence goes to ``speak`` the
  moment its last token is in, so the caller hears the first sentence while the model is still
  writing the rest;
* after a **barge-in** it stops the model and trims its history to the words the caller
  actually heard (``PlaybackInterrupted.words_played``; the sentences it had queued but not yet
  played are dropped), so the next prompt does not claim the bot said what nobody heard;
* the same :class:`LlmBot` handler answers every door: a direct ``Converse`` call
  (``converse`` below), and, served with :func:`voxgate_client.serve_bot` (``serve`` below),
  a phone call at the SIP bridge and a Twilio-style media stream, both of which dial it per call.

Run::

    python examples/llm_bot.py llm --listen 127.0.0.1:8099          # the stand-in model
    python examples/llm_bot.py serve --listen 127.0.0.1:7000 --llm 127.0.0.1:8099
    voxgate sip --gateway 127.0.0.1:50051 --bot grpc://127.0.0.1:7000
    python examples/llm_bot.py converse --gateway 127.0.0.1:50051 --llm 127.0.0.1:8099 \
        --play caller.wav

``serve`` prints ``bot listening on HOST:PORT``; ``converse`` prints one JSON line with what was
said. Nothing the caller says is logged.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import voxgate_client as vc

#: A sentence ends at . ! or ? followed by a space (or the end of the answer).
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


# -- the stand-in LLM (server) ------------------------------------------------------------------


def stand_in_answer(messages: list[dict[str, str]]) -> str:
    """What the stand-in model answers: a fixed, multi-sentence reply to the last user turn.

    Long enough (three sentences) that a caller can interrupt it; it quotes a few words of the
    question so a test can see that the model got what the bot heard.
    """
    question = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    words = " ".join(question.split()[:6]).strip(" .,!?") or "that"
    return (
        f"You asked about {words}. "
        "That is a good question, and I am glad you called about it today. "
        "Let me explain it slowly and carefully, one step at a time, so that nothing is missed."
    )


class StandInLlm:
    """A language-model API stand-in: ``POST /v1/stream`` with ``{"messages": [...]}``.

    Answers with ``text/event-stream``: ``data: {"token": "..."}`` per token (a word and its
    trailing space), ``token_delay_s`` apart, then ``data: [DONE]``. Records every request's
    messages (:attr:`requests`) and when each answer's last token left (:attr:`done_at`).
    """

    def __init__(self, token_delay_s: float = 0.08) -> None:
        self.token_delay_s = token_delay_s
        self.requests: list[list[dict[str, str]]] = []
        self.done_at: list[float] = []
        self._server: asyncio.Server | None = None
        self._answering: set[asyncio.Task[object]] = set()
        self._closing = False
        self.port = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen."""
        self._server = await asyncio.start_server(self._serve, host, port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def aclose(self) -> None:
        """Stop listening, and stop the answers still streaming (their bot may be gone)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        # Ended, not cancelled: on Python 3.11 asyncio's streams log a cancelled handler as
        # an error. Each answer stops at its next token.
        self._closing = True
        if self._answering:
            await asyncio.wait(self._answering, timeout=5.0)  # a silent client: not for ever

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._answering.add(task)
            task.add_done_callback(self._answering.discard)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.decode("latin-1").split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            body = json.loads(await reader.readexactly(length)) if length else {}
            messages = list(body.get("messages", []))
            self.requests.append(messages)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Cache-Control: no-cache\r\nConnection: close\r\n\r\n"
            )
            for token in re.findall(r"\S+\s*", stand_in_answer(messages)):
                await asyncio.sleep(self.token_delay_s)
                if self._closing:
                    return
                writer.write(b"data: " + json.dumps({"token": token}).encode() + b"\n\n")
                await writer.drain()
            self.done_at.append(asyncio.get_running_loop().time())
            writer.write(b"data: [DONE]\n\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass  # the bot hung up on us (barge-in): stop generating
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


# -- the LLM client ------------------------------------------------------------------------------


async def stream_completion(address: str, messages: list[dict[str, str]]) -> AsyncIterator[str]:
    """Tokens of the model's answer as they arrive (cancel the iteration to stop the model)."""
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        body = json.dumps({"messages": messages}).encode()
        writer.write(
            b"POST /v1/stream HTTP/1.1\r\nHost: llm\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        status = await reader.readline()
        if b" 200 " not in status:
            raise ConnectionError(f"the model answered {status[:40]!r}")
        await reader.readuntil(b"\r\n\r\n")
        while line := await reader.readline():
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                return
            yield str(json.loads(data)["token"])
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


# -- the bot -------------------------------------------------------------------------------------


@dataclass
class _Said:
    """One sentence the bot queued, and how much of it the caller heard."""

    speak_id: str
    text: str
    heard: str | None = None  # None: not played out yet


@dataclass
class _Conversation:
    """One call's history, as the model sees it."""

    messages: list[dict[str, str]] = field(default_factory=list)
    said: list[_Said] = field(default_factory=list)  # the current answer's sentences
    reply: asyncio.Task[None] | None = None

    def heard_text(self) -> str:
        """What the caller heard of the current answer: whole sentences, then cut words."""
        parts: list[str] = []
        for s in self.said:
            if s.heard is None:
                break
            if s.heard:
                parts.append(s.heard)
            if s.heard != s.text:
                break
        return " ".join(parts)


class LlmBot:
    """The bot: one :class:`_Conversation` per call, replies streamed sentence by sentence.

    Args:
        llm: ``host:port`` of the model API.
        greeting: said when the call starts.
    """

    def __init__(self, llm: str, greeting: str = "Hello, how can I help you?") -> None:
        self.llm = llm
        self.greeting = greeting
        #: Each ended call's history (what the model was told), for ``converse`` to print.
        self.histories: list[list[dict[str, str]]] = []

    async def __call__(self, call: vc.VoiceCall) -> None:
        """Handle one call (any door: this is a ``voxgate_client.BotHandler``)."""
        conv = _Conversation([{"role": "system", "content": "You are a helpful voice agent."}])
        await call.speak(self.greeting)
        conv.messages.append({"role": "assistant", "content": self.greeting})
        try:
            async for ev in call:
                if isinstance(ev, vc.Transcript) and ev.is_final and ev.text.strip():
                    await self._stop(conv)
                    conv.messages.append({"role": "user", "content": ev.text.strip()})
                    conv.said = []
                    conv.reply = asyncio.create_task(self._answer(call, conv))
                elif isinstance(ev, vc.PlaybackFinished):
                    for s in conv.said:
                        if s.speak_id == ev.speak_id:
                            s.heard = s.text
                elif isinstance(ev, vc.PlaybackInterrupted):
                    await self._interrupted(conv, ev)
        finally:
            await self._stop(conv)
            self.histories.append(conv.messages)

    async def _answer(self, call: vc.VoiceCall, conv: _Conversation) -> None:
        """Stream the model's answer; speak each sentence as soon as it is complete."""
        pending = ""
        async for token in stream_completion(self.llm, conv.messages):
            pending += token
            *sentences, pending = _SENTENCE_END.split(pending)
            for sentence in sentences:
                await self._say(call, conv, sentence)
        if pending.strip():
            await self._say(call, conv, pending.strip())

    async def _say(self, call: vc.VoiceCall, conv: _Conversation, sentence: str) -> None:
        sid = await call.speak(sentence)
        conv.said.append(_Said(sid, sentence))
        # The history holds what was sent; a barge-in trims it to what was heard.
        text = " ".join(s.text for s in conv.said)
        if conv.messages[-1]["role"] == "assistant":
            conv.messages[-1]["content"] = text
        else:
            conv.messages.append({"role": "assistant", "content": text})

    async def _interrupted(self, conv: _Conversation, ev: vc.PlaybackInterrupted) -> None:
        mine = next((s for s in conv.said if s.speak_id == ev.speak_id), None)
        if mine is None:
            return
        mine.heard = " ".join(ev.words_played)
        await self._stop(conv)  # the caller took the turn: stop the model
        if conv.messages and conv.messages[-1]["role"] == "assistant" and conv.said:
            heard = conv.heard_text()
            if heard:
                conv.messages[-1]["content"] = heard
            else:
                conv.messages.pop()  # nothing of the answer was heard

    @staticmethod
    async def _stop(conv: _Conversation) -> None:
        task, conv.reply = conv.reply, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])


# -- entry points --------------------------------------------------------------------------------


async def _serve(args: argparse.Namespace) -> int:
    host, _, port = args.listen.rpartition(":")
    server = await vc.serve_bot(LlmBot(args.llm), host=host, port=int(port))
    print(f"bot listening on {server.address}", flush=True)
    await server.wait_closed()
    return 0


async def _run_llm(args: argparse.Namespace) -> int:
    host, _, port = args.listen.rpartition(":")
    llm = StandInLlm(args.token_delay)
    await llm.start(host, int(port))
    print(f"llm listening on {host}:{llm.port}", flush=True)
    await asyncio.Event().wait()
    return 0


async def _converse(args: argparse.Namespace) -> int:
    """A direct Converse call: this process is the caller (plays a WAV) and the bot."""
    bot = LlmBot(args.llm)
    audio = vc.load_audio(args.play)
    async with vc.VoxgateClient(args.gateway) as client:
        call = await client.converse(
            vc.CallConfig(encoding=audio.encoding, sample_rate_hz=audio.sample_rate_hz)
        )
        async with call:
            handler = asyncio.create_task(bot(call))
            await vc.stream_audio(call, audio, vc.REALTIME)
            await call.flush()
            await asyncio.sleep(args.linger)  # let the answer play
            await call.hangup()
            await asyncio.wait_for(handler, 30)
    print(json.dumps({"history": bot.histories[-1]}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``llm``, ``serve`` or ``converse``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("llm", help="run the stand-in language model")
    p.add_argument("--listen", default="127.0.0.1:8099")
    p.add_argument("--token-delay", type=float, default=0.08)
    p = sub.add_parser("serve", help="serve the bot (voxgate.v1.VoxgateBot)")
    p.add_argument("--listen", default="127.0.0.1:7000")
    p.add_argument("--llm", default="127.0.0.1:8099")
    p = sub.add_parser("converse", help="one direct Converse call playing a WAV")
    p.add_argument("--gateway", default="127.0.0.1:50051")
    p.add_argument("--llm", default="127.0.0.1:8099")
    p.add_argument("--play", required=True)
    p.add_argument("--linger", type=float, default=8.0)
    args = ap.parse_args(argv)
    run = {"llm": _run_llm, "serve": _serve, "converse": _converse}[args.cmd]
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
