"""Reference-audio features of CosyVoice3 against PyPI reference implementations."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tritontts.upstream import s3tokenizer_utils
from tritontts.audio import decode_audio
from tritontts.families.cosyvoice3.features import prompt_mel
from tritontts.nn.mel import kaldi_fbank
from tritontts.nn.mel import slaney_mel_filters, whisper_log_mel
from tritontts.protocol import InvalidRequest


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


def slaney_basis(sr, n_fft, n_mels, fmin=0.0, fmax=None):
    """An independent Slaney mel basis (transformers' audio_utils), for vLLM-Omni's
    mel_spectrogram: its own basis builder needs torchaudio, which cannot load here."""
    from transformers.audio_utils import mel_filter_bank

    return torch.from_numpy(mel_filter_bank(
        n_fft // 2 + 1, n_mels, fmin, sr / 2 if fmax is None else fmax, sr,
        norm="slaney", mel_scale="slaney").T.astype(np.float32))


@pytest.fixture(scope="module")
def omni_mel():
    """vLLM-Omni 0.30's CosyVoice3 feat_extractor (matcha-style mel_spectrogram)."""
    import transformers.audio_utils  # noqa: F401 - before torchaudio's stand-in exists

    from tritontts.upstream import vllm_omni_module

    stand_ins = {"torchaudio": {}, "torchaudio.compliance": {}, "torchaudio.compliance.kaldi": {},
                 "vllm_omni.utils.audio": {"mel_filter_bank": slaney_basis}}
    with vllm_omni_module("vllm_omni.model_executor.models.cosyvoice3.utils", stand_ins) as utils:
        yield utils.mel_spectrogram


def test_prompt_mel_matches_vllm_omni_feat_extractor(speechlike, omni_mel):
    """cosyvoice3.yaml's feat_extractor: n_fft = win 1920, hop 480, 80 mels, fmin 0,
    fmax null (12 kHz), center False; 50 frames per second of 24 kHz audio."""
    audio24k = (np.repeat(speechlike, 3)[: 24000 * 2] / 2).astype(np.float32)
    ours = prompt_mel(audio24k)
    ref = omni_mel(torch.from_numpy(audio24k)[None], 1920, 80, 24000, 480, 1920, 0, None)[0].T.numpy()
    diff = float(np.abs(ref - ours).max())
    print(f"prompt mel vs vLLM-Omni mel_spectrogram: max-abs-diff {diff:.2e}")
    assert ours.shape == ref.shape == (100, 80) and diff < 1e-4
    # Negative control: the 8 kHz ceiling of older CosyVoice configs is told apart.
    ceiling_8k = omni_mel(torch.from_numpy(audio24k)[None], 1920, 80, 24000, 480, 1920, 0, 8000)
    assert float(np.abs(ceiling_8k[0].T.numpy() - ours).max()) > 0.1


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
