-- Volumes: persistent ext4 images a team mounts into its sandboxes (docs/volumes.md). The name is
-- unique per team; the token authenticates the /volumecontent API.
CREATE TABLE volumes (
    id TEXT PRIMARY KEY,
    team_id TEXT NOT NULL,
    name TEXT NOT NULL,
    token TEXT NOT NULL,
    size_mib INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    UNIQUE (team_id, name)
);

-- The volumes a sandbox mounts (JSON list of {volumeId, name, path}); NULL for none. They follow the
-- sandbox through pause, resume and fork.
ALTER TABLE sandboxes ADD COLUMN volume_mounts TEXT;
