"""What a run's devices are: one value where the pipeline once carried three booleans
(use_gpu, fake_gpus and "measured here"), two of whose combinations meant the same."""

from __future__ import annotations

import enum


class DeviceKind(enum.StrEnum):
    CPU = "cpu"
    """CPU cores, one per device (a CPU host)."""
    FAKE_GPU = "fake_gpu"
    """GPUs that exist only in Ray's bookkeeping (a test cluster on a CPU host): Ray
    places workers by GPU, but each device is a CPU thread."""
    GPU = "gpu"
    """Real CUDA GPUs."""

    @classmethod
    def from_flags(cls, *, gpu: bool, fake_cluster: bool) -> DeviceKind:
        """The kind the CLI's --gpu and --fake-cluster flags ask for."""
        if fake_cluster:
            return cls.FAKE_GPU
        return cls.GPU if gpu else cls.CPU

    @property
    def ray_gpus(self) -> bool:
        """Workers ask Ray for GPUs (ScalingConfig use_gpu, GPU bundles)."""
        return self is not DeviceKind.CPU

    @property
    def cuda(self) -> bool:
        """Devices are CUDA GPUs: NCCL, CUDA events, costs profiled on a GPU worker."""
        return self is DeviceKind.GPU

    @property
    def measured_here(self) -> bool:
        """Devices are CPU threads, whose costs this machine measures."""
        return not self.cuda

    @property
    def unit(self) -> str:
        """What Ray counts the devices in."""
        return "GPU" if self.ray_gpus else "CPU"
