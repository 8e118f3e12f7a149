-- Snapshots of running sandboxes (POST /sandboxes/{id}/snapshots): a CRIU checkpoint on disk that new
-- sandboxes restore from (its id or name works as a templateID). Pause checkpoints are not rows here:
-- they belong to their paused sandbox (sandboxes.snapshot_dir).

CREATE TABLE snapshots (
    id              TEXT PRIMARY KEY,
    name            TEXT,
    -- The sandbox it was taken from (kept after that sandbox is gone).
    sandbox_id      TEXT NOT NULL,
    template_id     TEXT NOT NULL,
    layers          TEXT NOT NULL,   -- JSON array of read-only layers under the checkpoint, top-most first
    dir             TEXT NOT NULL,
    size_bytes      INTEGER NOT NULL,
    -- sha256: every stored file has a SHA-256 in the checkpoint's manifest, verified at each restore;
    -- mismatch: a restore found a file that did not match; none: no manifest.
    checksum_status TEXT NOT NULL,
    vcpus           REAL NOT NULL,
    memory_mib      INTEGER NOT NULL,
    disk_mib        INTEGER NOT NULL,
    -- envd access token the checkpointed agent holds (needed to re-initialise a restored copy).
    envd_access_token TEXT,
    created_at      INTEGER NOT NULL
);
CREATE INDEX snapshots_sandbox ON snapshots (sandbox_id, created_at);
CREATE INDEX snapshots_name ON snapshots (name);
