"""The Ray Serve app end to end: a good stream's words equal the offline decode's while
bad clients (wrong rate or format, garbage bytes, an oversized chunk, a client that
vanishes mid-stream, one stream more than the replica admits) each get their error and
close code; the page in headless Chromium with a corpus WAV as the fake microphone and
as a dropped file (screenshots in test-artifacts/serving/)."""
from __future__ import annotations

import asyncio
import json
import shutil
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from serving import protocol as P
from tests.conftest import _free_port
from tests.test_serving import SHOTS, tiny_system  # noqa: F401  (the module fixture)

pytestmark = [pytest.mark.integration]

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def service(ray_local, tiny_system, tmp_path_factory):  # noqa: F811
    from ray import serve

    from core.config import load_config
    from serving.app import start

    port = _free_port()
    cfg = load_config(None, [f"storage.root={tmp_path_factory.mktemp('store')}",
                             f"serve.port={port}", "serve.ingress=proxy", "serve.max_streams=6",
                             "serve.max_chunk_bytes=16000", "serve.idle_timeout_s=20",
                             # the offline decode's rows (no speech gate), so that the
                             # streamed words can be held to the offline ones; the gate's
                             # own tests: tests/test_speech_activity.py
                             "serve.speech_gate=false",
                             "serve.app_name=amflow-serve-test"])
    url = start(cfg, tiny_system["assets"])
    yield url
    serve.shutdown()


def _pcm(w: np.ndarray) -> bytes:
    return np.clip(np.round(w * 32768), -32768, 32767).astype("<i2").tobytes()


async def _client(url: str, header, chunks, controls=True, vanish_after=None) -> dict:
    """Send the header, the chunks (bytes, or "END" between utterances), eof; collect the
    messages and the close code the server sent."""
    import websockets

    out = {"msgs": [], "code": None}
    async with websockets.connect(url.replace("http", "ws") + "ws") as ws:
        try:
            await ws.send(header if isinstance(header, (bytes, str)) else json.dumps(header))
            for i, c in enumerate(chunks):
                if vanish_after is not None and i == vanish_after:
                    ws.transport.abort()  # gone: no close handshake
                    return out
                await ws.send(json.dumps({"end_utterance": True}) if c == "END" else c)
                await asyncio.sleep(0)
            if controls:
                await ws.send(json.dumps({"eof": True}))
        except websockets.ConnectionClosed:
            pass  # refused mid-send: the error message is still to be read
        try:
            while True:
                out["msgs"].append(json.loads(await ws.recv()))
        except websockets.ConnectionClosed as exc:
            out["code"] = exc.rcvd.code if exc.rcvd else None
    return out


async def _hold(url: str, ready: asyncio.Event, release: asyncio.Event) -> dict:
    """An admitted stream that stays open (silence) until released."""
    import websockets

    async with websockets.connect(url.replace("http", "ws") + "ws") as ws:
        await ws.send(json.dumps({"sample_rate": 16000, "format": "s16le"}))
        first = json.loads(await ws.recv())
        ready.set()
        while not release.is_set():
            await ws.send(b"\x00\x00" * 1600)
            await asyncio.sleep(0.1)
        await ws.send(json.dumps({"eof": True}))
        msgs = [first] + [json.loads(m) async for m in ws]
    return {"msgs": msgs, "code": ws.close_code}


def test_bad_clients_get_their_close_codes_and_the_good_stream_is_unaffected(service, tiny_system):  # noqa: F811
    chunks = []
    for w in tiny_system["waves"]:
        pcm = _pcm(w)
        chunks += [pcm[i:i + 3200] for i in range(0, len(pcm), 3200)] + ["END"]
    chunks.pop()  # the last utterance ends with eof
    good_header = {"sample_rate": 16000, "format": "s16le"}

    async def main():
        ready, release = asyncio.Event(), asyncio.Event()
        holder = asyncio.create_task(_hold(service, ready, release))
        await asyncio.wait_for(ready.wait(), 60)
        good = asyncio.create_task(_client(service, good_header, chunks))
        vanish = asyncio.create_task(_client(service, good_header, chunks, vanish_after=5))
        bad = await asyncio.gather(
            _client(service, {"sample_rate": 8000, "format": "s16le"}, []),
            _client(service, {"sample_rate": 16000, "format": "f32le"}, []),
            _client(service, bytes(np.random.default_rng(0).integers(0, 256, 999, np.uint8)), []),
            _client(service, good_header, [b"\x00" * 20000]),
            _client(service, good_header, [b"\x00" * 3]),
            _client(service, {"sample_rate": 16000, "channels": "abc"}, []))
        await vanish
        release.set()
        return await good, bad, await holder

    good, bad, holder = asyncio.run(asyncio.wait_for(main(), 180))
    finals = [m["final"] for m in good["msgs"] if "final" in m]
    assert finals == tiny_system["words"] and good["code"] == P.NORMAL
    assert good["msgs"][0]["ready"] and good["msgs"][-1].get("eof")
    codes = [b["code"] for b in bad]
    assert codes == [P.UNSUPPORTED, P.UNSUPPORTED, P.UNSUPPORTED, P.TOO_BIG, P.UNSUPPORTED,
                     P.UNSUPPORTED], bad
    for b in bad:
        assert "error" in b["msgs"][-1]
    assert "sample_rate 8000" in bad[0]["msgs"][-1]["error"]
    assert holder["code"] == P.NORMAL
    for _ in range(50):  # every stream, the vanished one too, is dropped by the replica
        stats = json.loads(urllib.request.urlopen(service + "stats", timeout=10).read())
        if stats["streams"] == 0:
            break
        time.sleep(0.2)
    assert stats["streams"] == 0
    assert stats["cpu_s"] > 0  # what `amflow bench serve` divides by the audio served


def test_one_stream_more_than_the_replica_admits_is_told_to_try_again(service):
    async def main():
        events = [(asyncio.Event(), asyncio.Event()) for _ in range(6)]  # serve.max_streams
        holders = [asyncio.create_task(_hold(service, r, x)) for r, x in events]
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r, _ in events)), 60)
        extra = await _client(service, {"sample_rate": 16000, "format": "s16le"}, [])
        for _, x in events:
            x.set()
        return extra, await asyncio.gather(*holders)

    extra, held = asyncio.run(asyncio.wait_for(main(), 120))
    assert extra["code"] == P.TRY_AGAIN and "try again" in extra["msgs"][-1]["error"]
    assert all(h["code"] == P.NORMAL and h["msgs"][-1].get("eof") for h in held)


def _wav16(src: Path, dst: Path) -> Path:
    shutil.copy(src, dst)
    return dst


@pytest.mark.slow
def test_page_streams_the_fake_microphone_and_a_dropped_wav(service, tiny_system, tmp_path):  # noqa: F811
    from playwright.sync_api import expect, sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} missing: run scripts/system-deps.sh (installs Debian chromium)")
    shutil.rmtree(SHOTS, ignore_errors=True)
    SHOTS.mkdir(parents=True)
    wav = tmp_path / "speech.wav"
    import soundfile as sf

    sf.write(str(wav), np.concatenate(tiny_system["waves"][:2]), 16000, subtype="PCM_16")
    args = ARGS + ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
                   f"--use-file-for-fake-audio-capture={wav}", "--autoplay-policy=no-user-gesture-required"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args)
        page = browser.new_page(viewport={"width": 1000, "height": 700})
        try:
            page.goto(service)
            expect(page.locator("h1")).to_contain_text("streaming recognizer")
            page.click("#record")
            expect(page.locator("#status")).to_contain_text("streaming", timeout=30000)
            page.wait_for_timeout(4000)  # the fake microphone plays the WAV in a loop
            page.screenshot(path=SHOTS / "01-recording.png")
            page.click("#stop")
            expect(page.locator("#finals li")).to_have_count(1, timeout=30000)
            expect(page.locator("#status")).to_contain_text("done", timeout=30000)
            page.screenshot(path=SHOTS / "02-microphone-final.png")
            page.set_input_files("#file", str(wav))  # the drop zone's file input
            expect(page.locator("#finals li")).to_have_count(2, timeout=60000)
            got = page.locator("#finals li").nth(1).inner_text()
            page.screenshot(path=SHOTS / "03-wav-final.png")
        finally:
            page.screenshot(path=SHOTS / "99-last.png")
            browser.close()
    # the dropped file is one stream of both utterances without an utterance break, so
    # its words are not the per-utterance offline ones; it must recognise something
    assert got and got != "(nothing recognised)"
