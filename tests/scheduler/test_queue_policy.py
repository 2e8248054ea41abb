"""Fair share between tenants and the per-tenant limit, as pure functions."""

from datetime import timedelta

from swarm_contracts.jobs import JobState, utcnow
from swarm_scheduler.placement import plan
from swarm_scheduler.queue_policy import FairQueue

from .test_placement import job, worker


def test_a_flood_from_one_tenant_does_not_starve_another() -> None:
    flood = [job(f"job-a{i:02d}", age_s=100 - i, tenant="a") for i in range(20)]
    late = job("job-b00", age_s=1, tenant="b")  # submitted after all of a's
    result = plan([*flood, late], [worker("w1", cpus=2)], [*flood, late])
    # Two slots: one each, although FIFO alone would give both to tenant a.
    assert sorted(j.job_id for j, _ in result.placements) == ["job-a00", "job-b00"]


def test_the_tenant_with_fewer_running_jobs_goes_first() -> None:
    running = [job(f"job-r{i}", tenant="a") for i in range(2)]
    for r in running:
        r.state, r.worker_id = JobState.running, "w0"
    a = job("job-a", age_s=50, tenant="a")
    b = job("job-b", age_s=1, tenant="b")
    order = [j.job_id for j in FairQueue([a, b], [*running, a, b])]
    assert order == ["job-b", "job-a"]


def test_equal_running_counts_go_to_the_tenant_served_longest_ago() -> None:
    served_a = job("job-old-a", tenant="a")
    served_a.state, served_a.assigned_at = JobState.succeeded, utcnow()
    served_b = job("job-old-b", tenant="b")
    served_b.state, served_b.assigned_at = JobState.succeeded, utcnow() - timedelta(minutes=5)
    a = job("job-a", age_s=50, tenant="a")
    b = job("job-b", age_s=1, tenant="b")
    queue = FairQueue([a, b], [served_a, served_b, a, b])
    assert [j.job_id for j in queue] == ["job-b", "job-a"]


def test_fair_share_interleaves_tenants_and_keeps_fifo_within_one() -> None:
    jobs = [job(f"job-a{i}", age_s=100 - i, tenant="a") for i in range(3)]
    jobs += [job(f"job-b{i}", age_s=50 - i, tenant="b") for i in range(2)]
    queue = FairQueue(jobs, jobs)
    order = []
    for j in queue:
        order.append(j.job_id)
        queue.served(j)
    assert order == ["job-a0", "job-b0", "job-a1", "job-b1", "job-a2"]


def test_priority_still_comes_before_fair_share() -> None:
    low_b = job("job-b", age_s=100, tenant="b", priority=1)
    high_a = [job(f"job-a{i}", tenant="a", priority=9) for i in range(3)]
    result = plan([low_b, *high_a], [worker("w1", cpus=3)], [low_b, *high_a])
    assert sorted(j.job_id for j, _ in result.placements) == ["job-a0", "job-a1", "job-a2"]


def test_the_per_tenant_limit_keeps_extra_jobs_queued_with_a_reason() -> None:
    running = job("job-r", tenant="a")
    running.state, running.worker_id = JobState.running, "w1"
    queued = [job(f"job-a{i}", age_s=10 - i, tenant="a") for i in range(3)]
    other = job("job-b", tenant="b")
    all_jobs = [running, *queued, other]
    result = plan([*queued, other], [worker("w1", cpus=8)], all_jobs, tenant_max_running=2)
    assert sorted(j.job_id for j, _ in result.placements) == ["job-a0", "job-b"]
    assert result.waiting["job-a1"] == "tenant a is at its limit of 2 running jobs"
    unlimited = plan([*queued, other], [worker("w1", cpus=8)], all_jobs)
    assert len(unlimited.placements) == 4
