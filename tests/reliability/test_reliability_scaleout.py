"""Scale-out on the CPU (issue 18): two `kernelsearch worker` processes on one PostgreSQL, several
jobs (two of them sharing a case), one worker SIGKILLed mid-job. No case is tuned by two workers
at once, no trial is lost or counted twice (a job adds its n_trials to each of its cases'
studies, so the shared case's study holds both jobs' trials, each once), and the killed worker's
job is finished by the other."""
from __future__ import annotations

import pytest

from rel_faults import KERNEL, Procs, case, print_figures, study_figures, wait_final, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

N_TRIALS = 3
JOBS = [[case(11), case(12)], [case(13)], [case(14), case(12)], [case(15)]]


@pytest.mark.timeout(300)
def test_two_workers_one_killed_mid_job(pg_url, tmp_path):
    from kernelsearch.db.engine import upgrade
    from kernelsearch.db.store import Store

    upgrade(pg_url)
    store = Store(pg_url)
    procs = Procs(tmp_path, {"KS_DATABASE_URL": pg_url})
    try:
        jobs = [store.create_job(KERNEL, cases, N_TRIALS, "random").id for cases in JOBS]
        workers = {n: procs.worker(n) for n in ("worker-a", "worker-b")}

        def mid_job():
            for j in jobs:
                v = store.get_job(j)
                if v.status == "running" and v.trials_done >= 1 and v.owner in workers:
                    return v
            return None

        victim_job = wait_for(mid_job, 200, "a worker mid-job", procs)
        victim_name = victim_job.owner
        procs.kill(workers.pop(victim_name))
        (survivor_name, survivor), = workers.items()
        done_at_kill = store.get_job(victim_job.id).trials_done
        final = wait_final(store, jobs, 240, procs)
        cases = {tuple(sorted(c.items())): c for cs in JOBS for c in cs}.values()
        asked = {tuple(sorted(c.items())): N_TRIALS * sum(c in cs for cs in JOBS) for c in cases}
        studies = [study_figures(store, pg_url, KERNEL, c, asked[tuple(sorted(c.items()))])
                   for c in cases]
        records = store.list_records(kernel=KERNEL)
        by_job = {j.id: (j.status, j.owner, j.attempts, j.trials_done) for j in final}
        print_figures("scale-out: 2 workers, one SIGKILLed mid-job", {
            "killed": f"{victim_name} in job {victim_job.id} at trials_done {done_at_kill}",
            "jobs (status, owner, attempts, trials_done)": by_job,
            "jobs survived": f"{sum(j.status == 'succeeded' for j in final)} of {len(final)}",
            "trials lost": sum(s["lost"] for s in studies),
            "trials doubled": sum(s["doubled"] for s in studies),
            "records": len(records), "studies": studies,
        })
        assert all(j.status == "succeeded" for j in final), (by_job, procs.logs())
        killed = store.get_job(victim_job.id)
        assert killed.owner == survivor_name and killed.attempts == 2
        assert survivor.alive()
        for s in studies:
            want = asked[tuple(sorted(s["case"].items()))]
            assert s["evaluated"] == want and s["lost"] == 0 and s["doubled"] == 0, s
            assert s["history_matches"] and s["running"] == 0, s
        assert sorted(tuple(sorted(r.axes.items())) for r in records) == sorted(
            tuple(sorted(c.items())) for c in cases), "one record per case"
        assert all(r.n_trials >= N_TRIALS for r in records)
    finally:
        procs.close()
        store.close()
