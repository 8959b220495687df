"""The shop's `@task` functions: plain Django task code, nothing of Valka but its options.

`record` appends to the file SHOP_MARKS names: the order and times tasks ran in.
"""

import asyncio
import logging
import os
import time
from pathlib import Path

from django.tasks import task

from valka_sdk.errors import TaskCancelled

log = logging.getLogger(__name__)


def _mark(what: str) -> None:
    with open(os.environ["SHOP_MARKS"], "a") as f:
        f.write(f"{what} {time.time()}\n")


@task(queue_name="shop")
def add(a, b):
    log.warning("adding %s and %s", a, b)
    return a + b


@task
async def async_add(a, b):
    await asyncio.sleep(0)
    return {"sum": a + b}


@task(takes_context=True, max_retries=3)
def flaky(context, succeed_on):
    if context.attempt < succeed_on:
        raise ConnectionError(f"attempt {context.attempt} of {context.task_result.id}")
    return {"attempt": context.attempt, "attempts": context.task_result.attempts}


class CardDeclined(Exception):
    pass


@task(max_retries=0, metadata={"team": "billing"})
def charge(amount):
    raise CardDeclined(f"card declined for {amount}")


@task(max_retries=0)
def not_json():
    return {1, 2}


@task(queue_name="ordered")
def record(name):
    _mark(name)
    return name


@task(queue_name="ordered")
def hold(seconds):
    time.sleep(seconds)


@task
async def sleeper(name, seconds):
    _mark(f"{name}-started")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        _mark(f"{name}-stopped")
        raise
    _mark(f"{name}-finished")


@task
def sync_sleeper(name, seconds):
    _mark(f"{name}-started")
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            time.sleep(0.01)
    except TaskCancelled:
        _mark(f"{name}-stopped")
        raise
    _mark(f"{name}-finished")


def not_a_task():
    return Path(".")
