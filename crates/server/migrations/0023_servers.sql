-- Several servers sharing one PostgreSQL database and the same nodes (cluster mode).
-- servers: one row per running server process, renewed every few seconds; a row not renewed for the
--   lease (10 s) is a dead server. holds: the JSON array of sandbox IDs the server keeps on the
--   nodes without a sandbox row (its template builds' and warm pools' sandboxes), so the reconciler
--   of another server does not take them for strays. leader: 1 while it leads (for operators; the
--   lead itself is a PostgreSQL advisory lock).
-- owner: the server that made a sandbox's or a build's last change; a sandbox left mid-transition or
--   a build left unfinished by a dead server is settled by the others.
CREATE TABLE servers (
    id TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    started_at INTEGER NOT NULL,
    renewed_at INTEGER NOT NULL,
    holds TEXT NOT NULL DEFAULT '[]',
    leader INTEGER NOT NULL DEFAULT 0
);
ALTER TABLE sandboxes ADD COLUMN owner TEXT;
ALTER TABLE template_builds ADD COLUMN owner TEXT;
