-- Workspaces: each user of a team mapped to their sandbox (POST /workspaces/{user_id}/sandbox).
-- sandbox_id is the sandbox the user is on now; workspace_history keeps every move and its reason.
CREATE TABLE workspaces (
    team_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    template TEXT NOT NULL,
    sandbox_id TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (team_id, user_id)
);

CREATE TABLE workspace_history (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    team_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    sandbox_id TEXT NOT NULL,
    action TEXT NOT NULL,
    reason TEXT,
    at INTEGER NOT NULL
);
CREATE INDEX workspace_history_user ON workspace_history (team_id, user_id, seq);
