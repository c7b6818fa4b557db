"""Pricing: the hardware catalogue (chips, peaks, prices with their sources and dates), the
cost model (roofline time, money per step, per epoch, per 1M tokens) and the comparison of
devices that the profiler and the forecast both fill. Data and exports only: the views that
draw a comparison live in `gpu2tpu.views`."""
