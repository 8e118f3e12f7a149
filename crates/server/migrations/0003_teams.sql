-- Teams: every API key belongs to one, and a key sees and acts on its own team's sandboxes, snapshots
-- and templates only (public templates are seen by every team). Quotas are per team; NULL = no
-- limit beyond the node's own.

CREATE TABLE teams (
    id             TEXT PRIMARY KEY,
    name           TEXT NOT NULL UNIQUE,
    max_sandboxes  INTEGER,
    max_vcpus      REAL,
    max_memory_mib INTEGER,
    created_at     INTEGER NOT NULL
);
INSERT INTO teams (id, name, created_at) VALUES ('team_default', 'default', 0);

ALTER TABLE api_keys ADD COLUMN team_id TEXT NOT NULL DEFAULT 'team_default';
-- An admin key also manages teams and keys (of every team).
ALTER TABLE api_keys ADD COLUMN admin INTEGER NOT NULL DEFAULT 0;
-- Keys made before teams existed could do everything: they stay admins, in the default team.
UPDATE api_keys SET admin = 1;

ALTER TABLE sandboxes ADD COLUMN team_id TEXT NOT NULL DEFAULT 'team_default';
CREATE INDEX sandboxes_team ON sandboxes (team_id, state);
ALTER TABLE snapshots ADD COLUMN team_id TEXT NOT NULL DEFAULT 'team_default';
ALTER TABLE templates ADD COLUMN team_id TEXT NOT NULL DEFAULT 'team_default';
