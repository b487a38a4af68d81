"""The voxgate LiveKit plugin on its own: hear a recording, answer each sentence, save the replies.

    python examples/answer_a_recording.py --target 127.0.0.1:50051 [IN.wav] [--out reply.wav]

The same streams an ``AgentSession`` drives (``STT.stream()`` and ``TTS.stream()``), without a
LiveKit server: audio is pushed at real time (default: the client's bundled sample call) and
each final transcript is answered through a streamed synthesis.
"""

from __future__ import annotations

import argparse
import asyncio
import wave

from livekit import rtc
from livekit.agents import stt
from livekit.plugins import voxgate

from voxgate_client import read_wav, sample_call_path


async def main() -> None:
    """Stream the recording, answer each final, then write the replies."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wav", nargs="?", default=sample_call_path())
    ap.add_argument("--target", default="127.0.0.1:50051", help="voxgate host:port")
    ap.add_argument("--out", default="reply.wav")
    args = ap.parse_args()

    pcm, rate = read_wav(args.wav)
    ears = voxgate.STT(target=args.target, language="en")
    voice = voxgate.TTS(target=args.target, sample_rate=24000)
    heard = ears.stream()

    async def push() -> None:
        step = rate // 10  # 100 ms frames, at real time
        for i in range(0, len(pcm), step):
            chunk = pcm[i : i + step]
            heard.push_frame(rtc.AudioFrame(chunk.tobytes(), rate, 1, len(chunk)))
            await asyncio.sleep(0.1)
        heard.end_input()

    pusher = asyncio.create_task(push())
    replies = bytearray()
    async for ev in heard:
        if ev.type == stt.SpeechEventType.FINAL_TRANSCRIPT:
            text = ev.alternatives[0].text
            print(f"caller: {text}", flush=True)
            reply = voice.stream()
            reply.push_text(f"You said: {text}")
            reply.end_input()
            async for audio in reply:
                replies += bytes(audio.frame.data)
    await pusher
    await ears.aclose()
    await voice.aclose()

    with wave.open(args.out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24000)
        w.writeframes(bytes(replies))
    print(f"bot: {len(replies) / 2 / 24000:.1f} s of reply audio in {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
