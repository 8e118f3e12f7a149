-- Template builds and their state, so a build's outcome outlives the process that ran it: a build
-- is `waiting` when requested, `building` once started, then `ready` or `error` (with the reason).
-- At start-up the server fails builds an earlier run left waiting or building.
CREATE TABLE template_builds (
    build_id TEXT PRIMARY KEY,
    template_id TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX template_builds_template ON template_builds (template_id);
