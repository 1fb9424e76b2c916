"""Device names and availability."""

from __future__ import annotations

from typing import Union

import mlx.core as mx

from ._errors import DeviceUnavailable, InvalidArgument, OptionTypeError
from ._native import lib

DeviceLike = Union[str, mx.Device, mx.DeviceType, None]

_NATIVE = {mx.DeviceType.cpu: lib.EMLX_DEVICE_CPU, mx.DeviceType.gpu: lib.EMLX_DEVICE_GPU}
_FROM_NATIVE = {v: k for k, v in _NATIVE.items()}


def device_type(device: DeviceLike) -> mx.DeviceType:
    """Normalise "cpu"/"gpu"/mx.cpu/mx.Device(...) to a DeviceType; None means MLX's default."""
    if device is None:
        return mx.default_device().type
    if isinstance(device, mx.Device):
        return device.type
    if isinstance(device, mx.DeviceType):
        return device
    if isinstance(device, str) and device.lower() in ("cpu", "gpu"):
        return getattr(mx.DeviceType, device.lower())
    raise InvalidArgument(f"unknown device {device!r}; expected 'cpu', 'gpu' or an mx.Device")


def require_available(kind: mx.DeviceType) -> None:
    if not mx.is_available(mx.Device(kind)):
        raise DeviceUnavailable(
            f"device {kind.name} is not available in this MLX build "
            f"(mlx {mx.__version__}); use 'cpu' or install an MLX build with a {kind.name} backend"
        )


def native_device(kind: mx.DeviceType) -> int:
    return _NATIVE[kind]


def from_native_device(value: int) -> mx.DeviceType:
    return _FROM_NATIVE[value]


def stream_device(stream, device: DeviceLike = None) -> DeviceLike:
    """mlx's ``stream=`` (a Stream, Device or device name) as the ``device=`` of an op; an explicit device wins."""
    if stream is None or device is not None:
        return device
    if not isinstance(stream, (mx.Stream, mx.Device, mx.DeviceType)) and not (
            isinstance(stream, str) and stream.lower() in ("cpu", "gpu")):  # mlx's binding refuses it
        raise OptionTypeError(f"stream= takes an mx.Stream, an mx.Device or a device name, got {stream!r}")
    return getattr(stream, "device", stream)
