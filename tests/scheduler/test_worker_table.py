from swarm_contracts.workers import Heartbeat, Resources
from swarm_scheduler.worker_table import WorkerTable


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def heartbeat(worker_id: str) -> Heartbeat:
    res = Resources(cpus=2, memory_bytes=1 << 30)
    return Heartbeat(worker_id=worker_id, resources=res, free=res)


def test_a_silent_worker_is_lost_once_and_comes_back_on_its_next_heartbeat() -> None:
    clock = Clock()
    table = WorkerTable(timeout_s=10, clock=clock)
    assert table.heartbeat(heartbeat("w1"))[1] is True
    assert table.heartbeat(heartbeat("w1"))[1] is False
    clock.now = 5
    assert table.expire() == []
    clock.now = 11
    assert [w.worker_id for w in table.expire()] == ["w1"]
    assert table.expire() == []
    assert not table.is_alive("w1")
    assert table.known("w1")
    info, fresh = table.heartbeat(heartbeat("w1"))
    assert fresh
    assert info.state == "alive"
    assert table.is_alive("w1")
