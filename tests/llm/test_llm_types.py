"""The LLM layer's public types (llm/types.py)."""

from __future__ import annotations

import emlx_async as ea


def test_batch_driver_error_is_an_emlx_error_and_a_runtime_error():
    from emlx_async.llm import BatchDriverError, EngineBusy

    assert issubclass(BatchDriverError, ea.EMLXError) and issubclass(BatchDriverError, RuntimeError)
    assert issubclass(EngineBusy, ea.QueueFull) and issubclass(EngineBusy, ea.EMLXError)
