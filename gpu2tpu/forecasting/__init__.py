"""The forecast: compile a PyTorch training step for TPU targets with libtpu on a machine
that has none, and read the compiler's FLOPs, bytes and memory (`forecast.py` is the entry
point, `gpu2tpu.forecast` the public function). Named `forecasting` so that the package never
shadows the `gpu2tpu.forecast` function."""
