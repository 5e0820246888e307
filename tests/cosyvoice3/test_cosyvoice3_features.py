"""Reference-audio features of CosyVoice3 against PyPI reference implementations."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tritontts.testing.references import s3tokenizer_utils
from tritontts.audio import decode_audio
from tritontts.cosyvoice3.features import kaldi_fbank, prompt_mel, slaney_mel_filters, whisper_log_mel
from tritontts.stage import InvalidRequest


@pytest.fixture(scope="module")
def speechlike():
    rng = np.random.default_rng(0)
    t = np.arange(16000 * 3) / 16000
    return (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t))
            + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


def test_whisper_log_mel_matches_s3tokenizer(speechlike):
    utils = s3tokenizer_utils()
    ref = utils.log_mel_spectrogram(torch.from_numpy(speechlike), n_mels=128).numpy()
    ours = whisper_log_mel(speechlike)
    diff = float(np.abs(ref - ours).max())
    print(f"whisper log-mel vs s3tokenizer: max-abs-diff {diff:.2e}")
    assert ours.shape == ref.shape and diff < 1e-5
    filters = np.load(Path(utils.__file__).parent / "assets" / "mel_filters.npz")
    assert np.abs(filters["mel_128"] - slaney_mel_filters(16000, 400, 128)).max() < 1e-7


def test_kaldi_fbank_matches_kaldi_native_fbank(speechlike):
    import kaldi_native_fbank as knf

    opts = knf.FbankOptions()
    opts.frame_opts.dither = 0
    opts.frame_opts.samp_freq = 16000
    opts.mel_opts.num_bins = 80
    fbank = knf.OnlineFbank(opts)
    fbank.accept_waveform(16000, (speechlike * 32768).tolist())
    fbank.input_finished()
    ref = np.stack([fbank.get_frame(i) for i in range(fbank.num_frames_ready)])
    ours = kaldi_fbank(speechlike)
    diff = float(np.abs(ref - ours).max())
    print(f"kaldi fbank vs kaldi-native-fbank: max-abs-diff {diff:.2e}")
    assert ours.shape == ref.shape and diff < 1e-3


def test_prompt_mel_rate_and_range(speechlike):
    audio24k = np.repeat(speechlike, 3)[: 24000 * 2] / 2
    mel = prompt_mel(audio24k)
    assert mel.shape == (100, 80)  # 50 frames per second
    assert np.isfinite(mel).all() and mel.min() >= np.log(1e-5) - 1e-6


def test_decode_audio_errors_are_client_errors(speechlike):
    import soundfile as sf
    import io

    buf = io.BytesIO()
    sf.write(buf, speechlike, 16000, format="FLAC")
    audio, rate = decode_audio(buf.getvalue())
    assert rate == 16000 and np.abs(audio - speechlike).max() < 1e-3
    for bad, needle in ((b"", "empty"), (b"definitely not audio", "could not be decoded")):
        with pytest.raises(InvalidRequest, match=needle):
            decode_audio(bad, "ref_audio")
