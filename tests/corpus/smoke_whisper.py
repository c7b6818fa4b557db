"""Smoke run for openai-whisper: a model with random weights decodes one second of audio.

Run as `python smoke_whisper.py OUT` with the package under test on PYTHONPATH; writes the
log-Mel spectrogram, the encoder's output, the decoded tokens and text to OUT (torch.save).
"""

from __future__ import annotations

import sys

import numpy as np
import torch


def main(out: str) -> None:
    import whisper
    from whisper.model import ModelDimensions, Whisper

    torch.manual_seed(0)
    dims = ModelDimensions(
        n_mels=80, n_audio_ctx=1500, n_audio_state=64, n_audio_head=4, n_audio_layer=2,
        n_vocab=51865, n_text_ctx=448, n_text_state=64, n_text_head=4, n_text_layer=2,
    )  # fmt: skip
    model = Whisper(dims).eval()
    # Whisper leaves some parameters uninitialised (torch.empty: a checkpoint fills them), so
    # every parameter gets seeded values: the same model in every process.
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    t = np.arange(whisper.audio.SAMPLE_RATE, dtype=np.float32) / whisper.audio.SAMPLE_RATE
    audio = torch.from_numpy(0.3 * np.sin(2 * np.pi * 440 * t) + 0.1 * np.sin(2 * np.pi * 97 * t))
    audio = whisper.pad_or_trim(audio.float())
    mel = whisper.log_mel_spectrogram(audio)
    results: dict[str, object] = {"mel": mel}
    with torch.no_grad():
        results["encoded"] = model.encoder(mel[None])
    _, probs = model.detect_language(mel)
    results["language"] = max(probs, key=probs.get)
    options = whisper.DecodingOptions(
        language="en", fp16=False, without_timestamps=True, sample_len=24
    )
    decoded = whisper.decode(model, mel, options)
    results["tokens"] = decoded.tokens
    results["text"] = decoded.text
    results["avg_logprob"] = torch.tensor(decoded.avg_logprob)
    # The whole pipeline: transcribe() pads, windows and decodes (greedy, no fallback).
    result = whisper.transcribe(
        model, audio.numpy(), fp16=False, language="en", temperature=0.0,
        condition_on_previous_text=False, verbose=None,
    )  # fmt: skip
    results["transcribe.text"] = result["text"]
    results["transcribe.segments"] = [s["tokens"] for s in result["segments"]]
    torch.save(results, out)


if __name__ == "__main__":
    main(sys.argv[1])
