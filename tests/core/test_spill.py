"""glibc's mmap threshold: fixed only when the worker opts in, since nothing can put it back."""

from __future__ import annotations

import pytest

from airflow_provider_datagen.core import spill as spill_mod
from airflow_provider_datagen.exceptions import ConfigurationError


class SpyLibc:
    """The two glibc calls the spill makes, recorded instead of made."""

    def __init__(self) -> None:
        self.mallopt_calls: list[tuple[int, int]] = []
        self.trims = 0

    def mallopt(self, param: int, value: int) -> int:
        self.mallopt_calls.append((param, value))
        return 1

    def malloc_trim(self, pad: int) -> int:
        self.trims += 1
        return 1


@pytest.fixture
def libc(monkeypatch: pytest.MonkeyPatch) -> SpyLibc:
    spy = SpyLibc()
    monkeypatch.setattr(spill_mod, "_LIBC", spy)
    monkeypatch.delenv(spill_mod.TUNE_ALLOCATOR_ENV, raising=False)
    return spy


def test_the_allocator_is_left_alone_unless_the_worker_opts_in(libc: SpyLibc, monkeypatch: pytest.MonkeyPatch) -> None:
    spill_mod.bound_allocator()
    for off in ("", "0", "false", "No", " off "):
        monkeypatch.setenv("DATAGEN_TUNE_ALLOCATOR", off)
        spill_mod.bound_allocator()
    assert libc.mallopt_calls == []
    spill_mod.give_back_memory()  # giving freed pages back changes no setting: always done
    assert libc.trims == 1


@pytest.mark.parametrize("on", ["1", "true", "YES", "on"])
def test_opted_in_the_plan_maps_only_bucket_sized_blocks(
    libc: SpyLibc, monkeypatch: pytest.MonkeyPatch, on: str
) -> None:
    # glibc's default threshold (128 KB) mapped and unmapped every scan batch's arrays: a third of a
    # cold 10M plan's time was the kernel zeroing their pages (ADR 0019)
    monkeypatch.setenv("DATAGEN_TUNE_ALLOCATOR", on)
    spill_mod.bound_allocator()
    assert libc.mallopt_calls == [(-3, 16 * 1024 * 1024)]  # M_MMAP_THRESHOLD


def test_an_unreadable_opt_in_names_the_variable_and_its_values(libc: SpyLibc, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATAGEN_TUNE_ALLOCATOR", "sometimes")
    with pytest.raises(ConfigurationError, match=r"DATAGEN_TUNE_ALLOCATOR='sometimes' is neither on nor off"):
        spill_mod.bound_allocator()
    assert libc.mallopt_calls == []


def test_off_glibc_opting_in_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spill_mod, "_LIBC", None)
    monkeypatch.setenv("DATAGEN_TUNE_ALLOCATOR", "1")
    spill_mod.bound_allocator()
    spill_mod.give_back_memory()
