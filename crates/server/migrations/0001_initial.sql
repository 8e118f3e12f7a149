-- Warren's store: the only source of truth about sandboxes, templates, keys and events.
-- Times are Unix milliseconds (UTC).

CREATE TABLE api_keys (
    id           TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    -- First characters of the secret, shown in lists so a user can tell keys apart.
    prefix       TEXT NOT NULL,
    -- SHA-256 of the whole secret, hex.
    secret_hash  TEXT NOT NULL UNIQUE,
    created_at   INTEGER NOT NULL,
    last_used_at INTEGER,
    revoked_at   INTEGER
);

CREATE TABLE templates (
    id            TEXT PRIMARY KEY,
    aliases       TEXT NOT NULL,   -- JSON array of strings
    layers        TEXT NOT NULL,   -- JSON array of directories, top-most first
    build_id      TEXT NOT NULL,
    status        TEXT NOT NULL,   -- building | waiting | ready | error
    vcpus         REAL NOT NULL,
    memory_mib    INTEGER NOT NULL,
    disk_mib      INTEGER NOT NULL,
    envd_version  TEXT NOT NULL,
    public        INTEGER NOT NULL,
    spawn_count   INTEGER NOT NULL DEFAULT 0,
    last_spawned_at INTEGER,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL
);

CREATE TABLE sandboxes (
    id                TEXT PRIMARY KEY,
    template_id       TEXT NOT NULL,
    alias             TEXT,
    client_id         TEXT NOT NULL,
    state             TEXT NOT NULL,
    state_reason      TEXT,
    metadata          TEXT NOT NULL,  -- JSON object of strings
    env_vars          TEXT NOT NULL,  -- JSON object of strings
    vcpus             REAL NOT NULL,
    memory_mib        INTEGER NOT NULL,
    disk_mib          INTEGER NOT NULL,
    auto_pause        INTEGER NOT NULL,
    auto_resume       INTEGER NOT NULL,
    allow_internet    INTEGER,
    envd_access_token TEXT,
    ip                TEXT,
    init_pid          INTEGER,
    pause_kind        TEXT,           -- checkpoint | freeze, set while paused
    snapshot_dir      TEXT,
    started_at        INTEGER NOT NULL,
    end_at            INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL
);
CREATE INDEX sandboxes_state ON sandboxes (state);
CREATE INDEX sandboxes_end_at ON sandboxes (end_at);

CREATE TABLE sandbox_events (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    sandbox_id TEXT NOT NULL,
    from_state TEXT,
    to_state   TEXT NOT NULL,
    reason     TEXT,
    at         INTEGER NOT NULL
);
CREATE INDEX sandbox_events_sandbox ON sandbox_events (sandbox_id, seq);
