"""Patter (getpatter 0.7.0) as a Twilio server for patterd-loadgen.

Runs Patter's embedded server in pipeline mode -- Deepgram STT, Hermes LLM, ElevenLabs
HTTP-streaming TTS, all at mu-law 8 kHz like patterd -- with every provider pointed at the
load generator's fakes through the BENCH_* environment variables, fake credentials, telemetry
off, dashboard off. Patter's Deepgram URL is a module constant and its ElevenLabs REST client
has a fixed base URL, so both are replaced here before the first call.

Voice detection: ``BENCH_PATTER_VAD=silero`` (the default) runs Patter's own Silero VAD the
way Patter does by default when its ``silero`` extra (onnxruntime, numpy) is installed
(``pip install 'getpatter[silero]==0.7.0'``): the agent gets no ``vad=`` and each call's
handler loads ``SileroVAD.for_phone_call()`` -- one model session and one streaming state per
call (``stream_handler.py``, "auto-VAD enabled"). Not an explicit ``agent(vad=...)``: the agent
is shared by every call and Patter does not copy its VAD per call, so one streaming state
would be fed every call's audio. A missing extra is an error here, not Patter's silent
fallback. ``BENCH_PATTER_VAD=none`` reproduces the earlier runs without a VAD: the auto-VAD's
import of ``getpatter.providers.silero_vad`` is made to fail, which is exactly Patter's path
when the extra is not installed ("auto-VAD unavailable").
"""

import asyncio
import os
import sys

VAD = os.environ.get("BENCH_PATTER_VAD", "silero")
if VAD not in ("silero", "none"):
    sys.exit(f"BENCH_PATTER_VAD must be 'silero' or 'none', not {VAD!r}")
if VAD == "none":
    # ``import getpatter.providers.silero_vad`` now raises ImportError (Python's rule for a
    # ``None`` entry in sys.modules), so Patter's auto-VAD falls back to no VAD.
    sys.modules["getpatter.providers.silero_vad"] = None
else:
    try:
        import getpatter.providers.silero_vad  # noqa: F401
    except ImportError as e:
        sys.exit(
            f"BENCH_PATTER_VAD=silero needs Patter's silero extra ({e}): "
            "pip install 'getpatter[silero]==0.7.0', or set BENCH_PATTER_VAD=none"
        )

os.environ["PATTER_TELEMETRY_DISABLED"] = "1"
os.environ["DO_NOT_TRACK"] = "1"
os.environ["TWILIO_ACCOUNT_SID"] = os.environ["BENCH_ACCOUNT_SID"]
os.environ["TWILIO_AUTH_TOKEN"] = os.environ["BENCH_AUTH_TOKEN"]

import httpx  # noqa: E402

import getpatter.providers.deepgram_stt as deepgram_stt  # noqa: E402

deepgram_stt.DEEPGRAM_WS_URL = os.environ["BENCH_DEEPGRAM_URL"] + "/v1/listen"

import getpatter.server as patter_server  # noqa: E402

# Patter refuses an 11th media WebSocket from one IP address (``MAX_WS_PER_IP = 10``, a module
# constant in getpatter/server.py). Every simulated call comes from 127.0.0.1, so the
# benchmark lifts it (BENCH_PATTER_MAX_WS_PER_IP, default 100000); set it to 10 to see the
# stock behaviour: calls 11+ get HTTP 403 on the media socket.
patter_server.MAX_WS_PER_IP = int(os.environ.get("BENCH_PATTER_MAX_WS_PER_IP", "100000"))

from getpatter import Patter, Twilio  # noqa: E402
from getpatter.llm import hermes  # noqa: E402
from getpatter.providers.deepgram_stt import DeepgramSTT  # noqa: E402
from getpatter.providers.elevenlabs_tts import (  # noqa: E402
    ElevenLabsOutputFormat,
    ElevenLabsTTS,
)


class SharedClientElevenLabsTTS(ElevenLabsTTS):
    """ElevenLabs REST TTS whose HTTP client outlives a call.

    The agent holds ONE provider instance for every call, and Patter 0.7.0 closes it when a
    call ends (``stream_handler.py`` teardown, ``await self._tts.close()``), which closes its
    ``httpx`` client: every reply of every later call then fails with "Cannot send a request,
    as the client has been closed" (12 of 62 turns at 25 calls). The benchmark keeps the
    shared client open instead.
    """

    async def close(self) -> None:
        return None


def main() -> None:
    if os.environ.get("BENCH_DEBUG"):
        import logging

        logging.basicConfig(level=logging.DEBUG)
    public = os.environ["BENCH_PUBLIC_URL"].removeprefix("https://")
    phone = Patter(
        carrier=Twilio(),
        phone_number=os.environ["BENCH_NUMBER"],
        webhook_url=public,
    )
    tts = SharedClientElevenLabsTTS(
        api_key=os.environ["BENCH_ELEVENLABS_KEY"],
        voice_id="voice123",
        output_format=ElevenLabsOutputFormat.ULAW_8000,
    )
    tts._client = httpx.AsyncClient(
        base_url=os.environ["BENCH_ELEVENLABS_URL"] + "/v1",
        headers={"xi-api-key": os.environ["BENCH_ELEVENLABS_KEY"]},
        timeout=30.0,
    )
    agent = phone.agent(
        # Not ``DeepgramSTT.for_twilio``: Patter's pipeline decodes the carrier's mu-law to
        # 16 kHz linear PCM before the STT (stream_handler.py, ``start`` and
        # ``on_audio_received``), so a mu-law session would be fed PCM bytes -- to the fake
        # (and to real Deepgram) that is loud noise from the first frame. This is the
        # configuration Patter builds itself when given only a Deepgram key.
        stt=DeepgramSTT(
            api_key=os.environ["BENCH_DEEPGRAM_KEY"],
            encoding="linear16",
            sample_rate=16000,
        ),
        llm=hermes.LLM(
            api_key=os.environ["BENCH_HERMES_KEY"],
            base_url=os.environ["BENCH_HERMES_URL"],  # already ends in /v1
        ),
        tts=tts,
        system_prompt="You are a benchmark agent.",
        first_message="Hello, thanks for calling.",
    )
    asyncio.run(
        phone.serve(agent, port=int(os.environ["BENCH_PORT"]), dashboard=False)
    )


if __name__ == "__main__":
    main()
