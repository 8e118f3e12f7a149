-- Sampled resource use of running sandboxes (the monitor writes a row per sandbox every metrics
-- interval and deletes rows older than the retention), for GET /sandboxes/{id}/metrics?start=&end=.
CREATE TABLE sandbox_metrics (
    sandbox_id  TEXT NOT NULL,
    at          INTEGER NOT NULL,  -- unix millis
    cpu_pct     REAL NOT NULL,     -- of the sandbox's vCPUs
    cpu_count   INTEGER NOT NULL,
    mem_used    INTEGER NOT NULL,
    mem_total   INTEGER NOT NULL,
    disk_used   INTEGER NOT NULL,
    disk_total  INTEGER NOT NULL,
    pids        INTEGER NOT NULL,
    oom_kills   INTEGER NOT NULL,  -- the cgroup's count so far (restarts at a restore)
    PRIMARY KEY (sandbox_id, at)
);
CREATE INDEX sandbox_metrics_at ON sandbox_metrics (at);
