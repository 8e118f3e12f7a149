-- Webhooks (E2B's /events/webhooks): a team's URL that gets each lifecycle event of the team's
-- sandboxes it subscribed to. `delivered_seq` is the last sandbox_events.seq handed over (or given
-- up on after the retries), so deliveries go on where they stopped after a restart.
CREATE TABLE webhooks (
    id            TEXT PRIMARY KEY,
    team_id       TEXT NOT NULL,
    name          TEXT NOT NULL,
    url           TEXT NOT NULL,
    enabled       INTEGER NOT NULL,
    events        TEXT NOT NULL,   -- JSON array of event types
    secret        TEXT,            -- signs deliveries; never shown again
    delivered_seq INTEGER NOT NULL,
    created_at    INTEGER NOT NULL
);
CREATE INDEX webhooks_team ON webhooks (team_id);
