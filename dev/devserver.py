"""``make airflow``: Airflow's components on 127.0.0.1 with the example DAGs, for clicking through by hand.

The components are started and stopped by :class:`dev.stack.AirflowStack`; this module is its command
line. Ctrl-C (or SIGTERM) stops every component by PID.

Usage::

    python -m dev.devserver [--port 8080] [--home .airflow] [--dags-folder DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import signal
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

from dev.processes import StackError
from dev.stack import AirflowStack, StackSettings

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence


def default_dags_folder() -> Path:
    """The installed package's ``example_dags`` folder (found without importing anything of Airflow's)."""
    spec = importlib.util.find_spec("airflow_provider_datagen.example_dags")
    if spec is None or not spec.submodule_search_locations:
        raise StackError("airflow_provider_datagen is not installed in this environment; run `make .venv`")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def _print(out: IO[str], text: str) -> None:
    out.write(text + "\n")
    out.flush()


@contextlib.contextmanager
def _stop_signals_as_keyboard_interrupt() -> Iterator[None]:
    # SIGINT is set explicitly too: a shell starts background jobs with SIGINT ignored, and Python
    # then never raises KeyboardInterrupt, so `kill -INT` would leave the components running.
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dev.devserver",
        description="Run Airflow (api-server, scheduler, dag-processor, triggerer) on 127.0.0.1.",
    )
    parser.add_argument("--port", type=int, default=8080, help="api-server port on 127.0.0.1 (8080)")
    parser.add_argument("--home", type=Path, default=Path(".airflow"), help="AIRFLOW_HOME (./.airflow)")
    parser.add_argument("--dags-folder", type=Path, default=None, help="DAGs folder (the example DAGs)")
    parser.add_argument("--username", default="admin")
    parser.add_argument("--password", default="admin")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    settings = StackSettings(
        home=args.home.resolve(),
        dags_folder=(args.dags_folder or default_dags_folder()).resolve(),
        port=args.port,
        username=args.username,
        password=args.password,
        dag_refresh_interval=10,
    )
    stack = AirflowStack(settings)
    out = sys.stdout
    with _stop_signals_as_keyboard_interrupt():
        try:
            _print(out, f"Starting Airflow in {settings.home} (component logs in {settings.logs}) ...")
            stack.start()
            took = stack.wait_healthy(timeout=180)
            _print(out, f"\nAirflow is up after {took:.0f} s: {settings.base_url}/")
            _print(out, f"  login:    {settings.username}")
            _print(out, f"  password: {settings.password}")
            _print(out, f"  DAGs:     {settings.dags_folder}")
            _print(out, "Press Ctrl-C to stop.")
            while True:
                stack.check_alive()
                time.sleep(1)
        except KeyboardInterrupt:
            _print(out, "\nStopping ...")
        except StackError as err:
            _print(out, f"\n{err}")
            return 1
        finally:
            killed = stack.stop()
            if killed:
                _print(out, f"Had to SIGKILL: {', '.join(killed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
