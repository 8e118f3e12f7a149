-- Idempotency-Key of sandbox creates: a retried create with the same key (in the same team) returns
-- the sandbox the first one made, never a second. `sandbox_id` is NULL while the first create runs;
-- a create that fails removes its row so a retry may try again. Rows older than a day are dropped.

CREATE TABLE idempotency_keys (
    team_id      TEXT NOT NULL,
    key          TEXT NOT NULL,
    -- SHA-256 of the request, so the same key with a different request is refused.
    request_hash TEXT NOT NULL,
    sandbox_id   TEXT,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (team_id, key)
);
