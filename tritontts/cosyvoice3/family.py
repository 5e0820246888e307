"""CosyVoice3's descriptor: voice cloning from a reference recording, 24 kHz."""
from __future__ import annotations

from pathlib import Path

from ..family import Capabilities, Family
from .request import KNOWN, parse_cosyvoice3_params


def _preflight(path: Path) -> None:
    from .checkpoint import open_checkpoint

    open_checkpoint(path)


def _write_random_checkpoint(out: Path, seed: int = 0, size: str = "tiny") -> Path:
    from .random_checkpoint import write_random_checkpoint

    return write_random_checkpoint(out, seed, size)


def _example_params() -> dict:
    """A 3 s synthetic reference: enough for the tiny checkpoint's tokenizers."""
    import base64
    import io

    import numpy as np
    import soundfile as sf

    rate = 24000
    t = np.arange(3 * rate) / rate
    audio = (0.3 * np.sin(2 * np.pi * 150 * t) * (1 + np.sin(2 * np.pi * 2 * t))).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, audio, rate, format="WAV")
    return {"ref_audio": base64.b64encode(buf.getvalue()).decode(),
            "ref_text": "This is the reference voice."}


def _export_graphs(path: Path) -> list:
    from .checkpoint import open_checkpoint
    from .stages import export_graphs

    return export_graphs(open_checkpoint(path))


FAMILY = Family(
    name="cosyvoice3",
    description="Fun-CosyVoice3: vLLM talker -> flow matching DiT -> CausalHiFT; clones "
                "the voice of ref_audio",
    stages=("cosyvoice3_prompt", "cosyvoice3_talker", "cosyvoice3_flow", "cosyvoice3_hift"),
    parse_params=parse_cosyvoice3_params,
    fields=frozenset(KNOWN),
    capabilities=Capabilities(sample_rate=24000, native_speed=False, reference_audio=True,
                              instructions=False, languages=("zh", "en", "ja", "ko", "de", "es",
                                                             "fr", "it", "ru")),
    checkpoint_help="a Fun-CosyVoice3-0.5B-2512 directory: cosyvoice3.yaml, llm.pt, flow.pt, "
                    "hift.pt, campplus.onnx, speech_tokenizer_v3.onnx, CosyVoice-BlankEN/",
    checkpoint_required=True,
    preflight=_preflight,
    voices=lambda checkpoint: ["default"],
    voice_encoder="cosyvoice3_prompt",
    released_names=("FunAudioLLM/Fun-CosyVoice3-0.5B-2512",),
    write_random_checkpoint=_write_random_checkpoint,
    export_graphs=_export_graphs,
    example_params=_example_params,
)
