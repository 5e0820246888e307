"""tritontts-demo: a Gradio page in front of the OpenAI audio front.

  tritontts-demo                                   # the front on localhost:8091, page on :7860
  tritontts-demo --url http://tts.internal:8091 --port 7860 --share-host 0.0.0.0

Pick a model and a voice (from the front's /v1/models and /v1/audio/voices), type text,
optionally upload or record a reference (families that clone), press Generate: the audio
plays while it is synthesized (the front streams raw PCM; the page's player queues the
pieces back to back), and the whole file is offered for download when it is done.
Needs the `demo` extra (`pip install '.[demo]'`; the full setup installs it).
"""
from __future__ import annotations

import argparse
import importlib.util
import io
import os
import shutil
import sys
import tempfile
import wave
from pathlib import Path

import httpx
import numpy as np

from ..weights.checkpoint import cache_root
from .common import DEFAULT_URL, data_url, error_message

SAMPLE_WIDTH = 2                      # the front's pcm: 16-bit little-endian mono
STREAM_PIECE_SECONDS = 0.5            # what the page's player gets at a time


class FrontClient:
    def __init__(self, url: str, api_key: str | None = None):
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def models(self) -> list[str]:
        r = httpx.get(self.url + "/v1/models", headers=self.headers, timeout=10)
        r.raise_for_status()
        return [m["id"] for m in r.json()["data"]]

    def voices(self) -> dict[str, list[str]]:
        r = httpx.get(self.url + "/v1/audio/voices", headers=self.headers, timeout=10)
        r.raise_for_status()
        by_model: dict[str, list[str]] = {}
        for voice in r.json()["data"]:
            by_model.setdefault(voice["model"], []).append(voice["name"])
        return by_model

    def sample_rate(self, model: str) -> int:
        """From a one-word WAV: the front's pcm carries no header, the WAV does."""
        r = httpx.post(self.url + "/v1/audio/speech", headers=self.headers, timeout=300,
                       json={"model": model, "input": "Hi.", "response_format": "wav"})
        if r.status_code != 200:
            raise RuntimeError(error_message(r.status_code, r.content))
        with wave.open(io.BytesIO(r.content)) as w:
            return w.getframerate()


def speech_body(model: str, voice: str, text: str, reference: str | None, ref_text: str,
                seed: float | None) -> dict:
    body = {"model": model, "voice": voice or "default", "input": text,
            "response_format": "pcm", "stream_format": "audio"}
    if reference:
        body["ref_audio"] = data_url(Path(reference))
        if ref_text.strip():
            body["ref_text"] = ref_text.strip()
    if seed is not None:
        body["seed"] = int(seed)
    return body


def build(front: FrontClient):
    import gradio as gr

    models = front.models()
    voices = front.voices()
    rates: dict[str, int] = {}

    def voices_for(model: str):
        names = voices.get(model, ["default"])
        return gr.update(choices=names, value=names[0])

    def generate(model, voice, text, reference, ref_text, seed):
        if not text or not text.strip():
            raise gr.Error("Type some text to speak.")
        if model not in rates:
            rates[model] = front.sample_rate(model)
        rate = rates[model]
        piece_bytes = int(rate * STREAM_PIECE_SECONDS) * SAMPLE_WIDTH
        body = speech_body(model, voice, text, reference, ref_text or "", seed)
        pcm, pending = bytearray(), bytearray()
        with httpx.stream("POST", front.url + "/v1/audio/speech", json=body,
                          headers=front.headers, timeout=600) as r:
            if r.status_code != 200:
                raise gr.Error(error_message(r.status_code, r.read()))
            for data in r.iter_bytes():
                pcm += data
                pending += data
                usable = len(pending) - len(pending) % SAMPLE_WIDTH
                if usable >= piece_bytes:
                    yield (rate, np.frombuffer(bytes(pending[:usable]), "<i2")), gr.skip()
                    del pending[:usable]
        if len(pending) >= SAMPLE_WIDTH:
            usable = len(pending) - len(pending) % SAMPLE_WIDTH
            yield (rate, np.frombuffer(bytes(pending[:usable]), "<i2")), gr.skip()
        path = Path(tempfile.mkdtemp(prefix="tritontts-demo-")) / "speech.wav"
        with wave.open(str(path), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(SAMPLE_WIDTH)
            w.setframerate(rate)
            w.writeframes(bytes(pcm))
        yield gr.skip(), str(path)

    with gr.Blocks(title="tritontts") as page:
        gr.Markdown(f"# tritontts\nText to speech through `{front.url}` (Triton Inference Server).")
        with gr.Row():
            model = gr.Dropdown(models, value=models[0] if models else None, label="Model")
            first = voices.get(models[0], ["default"]) if models else ["default"]
            voice = gr.Dropdown(first, value=first[0], label="Voice", allow_custom_value=True)
            seed = gr.Number(label="Seed (optional: the same seed, the same audio)", value=None,
                             precision=0)
        text = gr.Textbox(label="Text", lines=4, elem_id="text",
                          value="Hello! This voice is served by Triton Inference Server.")
        with gr.Accordion("Reference voice (families that clone)", open=False):
            reference = gr.Audio(sources=["upload", "microphone"], type="filepath",
                                 label="Reference recording")
            ref_text = gr.Textbox(label="What the reference says")
        button = gr.Button("Generate", variant="primary", elem_id="generate")
        player = gr.Audio(label="Speech", streaming=True, autoplay=True, elem_id="player")
        download = gr.File(label="Download", elem_id="download")
        model.change(voices_for, model, voice)
        button.click(generate, [model, voice, text, reference, ref_text, seed], [player, download])
    return page


def provide_ffmpeg() -> None:
    """Gradio encodes a streamed audio output with the ffmpeg program. Without one on PATH,
    use the static build the imageio-ffmpeg wheel carries (the `demo` extra), under the
    name Gradio looks for, so the demo needs nothing outside pip."""
    if shutil.which("ffmpeg"):
        return
    import imageio_ffmpeg

    folder = cache_root() / "bin"
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "ffmpeg"
    if not link.exists():
        link.symlink_to(imageio_ffmpeg.get_ffmpeg_exe())
    os.environ["PATH"] = f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tritontts-demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=DEFAULT_URL, help="the front (default: %(default)s)")
    parser.add_argument("--api-key", help="Bearer key if the front requires one")
    parser.add_argument("--port", type=int, default=7860, help="the page's port (default: %(default)s)")
    parser.add_argument("--share-host", default="127.0.0.1",
                        help="address the page listens on (default: %(default)s; 0.0.0.0 for others)")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("gradio") is None:
        print("tritontts-demo needs Gradio: pip install '.[demo]'", file=sys.stderr)
        return 2
    provide_ffmpeg()
    try:
        page = build(FrontClient(args.url, args.api_key))
    except httpx.HTTPError as exc:
        print(f"tritontts-demo: cannot reach the front at {args.url}: {exc}", file=sys.stderr)
        return 1
    page.queue().launch(server_name=args.share_host, server_port=args.port, show_error=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
