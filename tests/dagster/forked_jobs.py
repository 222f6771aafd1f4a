"""Jobs that ``test_run_launcher.py`` launches through ``ForkedRunLauncher``, loaded from this
file by the run's process as a code location's module would be."""

import os
import sys
import time
from pathlib import Path

import dagster as dg


@dg.op(config_schema={"report": str})
def report_process(context: dg.OpExecutionContext) -> None:
    """Writes the command line of the run's parent process, which fork-unsafe libraries
    (thread pools at import) the run's process holds, and its event log's class."""
    parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    unsafe = sorted(name for name in ("numpy", "polars", "pyarrow") if name in sys.modules)
    storage = type(context.instance.event_log_storage).__name__
    Path(context.op_config["report"]).write_text(f"{parent}\n{unsafe}\n{storage}")


@dg.op(config_schema={"started": str})
def wait_forever(context: dg.OpExecutionContext) -> None:
    Path(context.op_config["started"]).write_text(str(os.getpid()))
    while True:
        time.sleep(0.1)


@dg.job(executor_def=dg.in_process_executor)
def reporting_job() -> None:
    report_process()


@dg.job(executor_def=dg.in_process_executor)
def waiting_job() -> None:
    wait_forever()
