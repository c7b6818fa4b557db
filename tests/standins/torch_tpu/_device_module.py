"""STAND-IN for TorchTPU's `torch.tpu` device module: records the calls gpu2tpu makes."""

import os


class StandInTpuModule:
    calls: list[str] = []
    peak_resets = 0

    @classmethod
    def device_count(cls) -> int:
        return int(os.environ.get("GPU2TPU_STANDIN_TPU_CHIPS", "4"))

    @classmethod
    def is_available(cls) -> bool:
        return cls.device_count() > 0

    @classmethod
    def get_device_name(cls, device=None) -> str:
        return "TPU v5 lite"

    @classmethod
    def synchronize(cls, device=None) -> None:
        cls.calls.append("synchronize")

    @classmethod
    def memory_stats(cls) -> dict:
        return {"allocated_bytes.all.current": 1024, "allocated_bytes.all.peak": 4096}

    @classmethod
    def mem_get_info(cls) -> tuple[int, int]:
        return (15 * 2**30, 16 * 2**30)

    @classmethod
    def reset_peak_memory_stats(cls) -> None:
        cls.peak_resets += 1

    @classmethod
    def _get_cache_misses(cls) -> int:
        return 7
