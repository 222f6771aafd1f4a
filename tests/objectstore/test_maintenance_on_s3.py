"""Maintenance on an S3 lake (moto's server): the lease lets one of several processes in, and
a pass compacts and vacuums through the object store without losing a row."""

from __future__ import annotations

import threading

from s3_lake import S3

from claw_pipelines.lease import Lease
from claw_pipelines.maintenance import Retention, maintain_lake
from claw_pipelines.schemas import Turn, rows_to_arrow, utc_now


def test_one_of_several_takes_the_lease_and_its_pass_keeps_every_row(s3: S3) -> None:
    lake = s3.new_lake()
    writer, now = lake.writer("turns"), utc_now()
    for index in range(20):
        turn = Turn(turn_id=f"turn-{index:03d}", model="m", started_at=now, ended_at=now)
        writer.append(rows_to_arrow(Turn, [turn.model_dump()]))
    leases = [Lease(lake, f"proxy-{i}", 60) for i in range(3)]
    leases[0].table()
    start, taken = threading.Barrier(3), {}

    def ask(lease: Lease) -> None:
        start.wait()
        taken[lease.holder] = lease.acquire()

    threads = [threading.Thread(target=ask, args=(lease,)) for lease in leases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(taken.values()) == 1, taken
    holder = next(lease for lease in leases if taken[lease.holder])
    assert all(
        maintain_lake(lake, Retention(), lease) is None for lease in leases if lease is not holder
    )

    def data_keys() -> list[str]:
        return [k for k in s3.keys(lake) if "/turns/" in k and k.endswith(".parquet")
                and "_delta_log" not in k]  # fmt: skip

    assert len(data_keys()) == 20
    now_retention = Retention(
        vacuum_retention_hours=0, enforce_retention_duration=False, compact_after_files=4
    )
    (done,) = maintain_lake(lake, now_retention, holder)
    assert (done.files_before, done.files_after, done.vacuumed) == (20, 1, 20)
    assert len(data_keys()) == 1
    assert any(k.endswith("checkpoint.parquet") for k in s3.keys(lake) if "/turns/" in k)
    ids = lake.scan("turns").collect().get_column("turn_id").sort().to_list()
    assert ids == [f"turn-{index:03d}" for index in range(20)]
