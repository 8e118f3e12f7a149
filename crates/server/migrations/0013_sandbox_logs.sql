-- What each sandbox's commands printed and when its processes started and ended, collected from its
-- agent by the monitor (GET /sandboxes/{id}/logs merges these with the lifecycle events). Rows are
-- deleted after the log retention, and beyond a bound per sandbox, oldest first.
CREATE TABLE sandbox_logs (
    sandbox_id  TEXT NOT NULL,
    seq         INTEGER NOT NULL,  -- the agent's sequence number (it never reuses one)
    at          INTEGER NOT NULL,  -- unix millis
    level       TEXT NOT NULL,     -- debug, info, warn or error
    message     TEXT NOT NULL,
    fields      TEXT NOT NULL,     -- JSON object of strings
    PRIMARY KEY (sandbox_id, seq)
);
CREATE INDEX sandbox_logs_at ON sandbox_logs (sandbox_id, at);
CREATE INDEX sandbox_logs_retention ON sandbox_logs (at);
