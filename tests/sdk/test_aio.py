"""The long-running processes' event loop: uvloop unless turned off."""

import asyncio

import pytest

from valka_sdk import aio


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_processes_run_on_uvloop_by_default(monkeypatch):
    monkeypatch.delenv("VALKA_UVLOOP", raising=False)
    assert aio.run(_loop_module()).startswith("uvloop")


@pytest.mark.parametrize("value", ["false", "0", "off"])
def test_uvloop_can_be_turned_off(monkeypatch, value):
    monkeypatch.setenv("VALKA_UVLOOP", value)
    assert aio.run(_loop_module()).startswith("asyncio")
